#!/usr/bin/env bash
# Resume on the GPU with the optimizer wherever it runs (after backward with clipping, beside
# backward without, and after backward without): the tiny model 6 steps in one run, and 3 + 3 with
# --resume_from_checkpoint; steps 4-6 must match to bf16 rounding (attention's backward sums in
# varying order). A checkpoint written while an update was still running would differ.
# Assumes build-gpu/glm_hpc (gpu_session.sh). Prints one line per variant.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
# Each variant is "label;glm_hpc options".
for variant in "clip;--max_grad_norm 1" "noclip;--max_grad_norm 0" "noclip_after;--max_grad_norm 0 --optimizer_in_backward false"; do
  IFS=';' read -r label args <<<"$variant"
  read -r -a arg_list <<<"$args"
  rm -rf "/tmp/resume_$label" "/tmp/resume_${label}_b"
  common=(--device cuda --max_steps 6 --save_steps 3 --logging_steps 1 --learning_rate 1e-3 "${arg_list[@]}")
  mpirun -np 1 build-gpu/glm_hpc "${common[@]}" --output_dir "/tmp/resume_$label" \
    >"$OUT/resume_$label.log" 2>&1 || { echo "$label: run failed"; tail -4 "$OUT/resume_$label.log"; continue; }
  mpirun -np 1 build-gpu/glm_hpc "${common[@]}" --output_dir "/tmp/resume_${label}_b" \
    --resume_from_checkpoint "/tmp/resume_$label/checkpoint-3" >"$OUT/resume_${label}_b.log" 2>&1 ||
    { echo "$label: resumed run failed"; tail -4 "$OUT/resume_${label}_b.log"; continue; }
  python3 - "$label" "/tmp/resume_$label/logging.jsonl" "/tmp/resume_${label}_b/logging.jsonl" <<'PY'
import json, sys
label, a, b = sys.argv[1:]
def steps(p):
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in open(p)) if "loss" in r}
full, resumed = steps(a), steps(b)
common = sorted(set(full) & set(resumed))
gap = max(abs(full[s] - resumed[s]) / full[s] for s in common) if common else float("nan")
ok = common == [4, 5, 6] and gap < 1e-3
print(f"resume {label:12s} steps {common}: worst relative loss gap {gap:.2e} ({'ok' if ok else 'FAILED'}); "
      f"loss at 3 / 6: {full.get(3, float('nan')):.5f} / {full.get(6, float('nan')):.5f}")
PY
done
