#!/usr/bin/env bash
# The 12-layer end-to-end run (GLM-4-9B shapes, seq 4096, micro-batch 1, random tokens) once per
# variant, for A/B comparisons inside one call. Assumes build-gpu/glm_hpc is built (gpu_session.sh
# with GLM_ONLY_BUILD=1). Each variant is "label;ENV=V ...;--option value ...": the environment
# glm_hpc runs in (rarely needed: glm_hpc's performance settings are options, see --help's
# "Performance" group) and options appended to its command line, e.g.
# "tuned;;--max_grad_norm 0 --gemm_autotune large". GLM_E2E_STEPS (default 8) steps; tokens/s is
# the mean over the steps after the third. A variant with --profile true prints its per-op table.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
# GLM_E2E_PROMPT_FRACTION (default 0): the first fraction of every row is prompt (labels -100,
# no loss), as in SFT data; the peer's --prompt_fraction does the same.
fraction=${GLM_E2E_PROMPT_FRACTION:-0}
data=/tmp/bench4096_p$fraction.jsonl
[ -f "$data" ] || python3 - "$data" "$fraction" <<'PY'
import json, random, sys
random.seed(0)
prompt = int(float(sys.argv[2]) * 4096)
with open(sys.argv[1], "w") as f:
    for _ in range(16):
        ids = [random.randrange(151552) for _ in range(4096)]
        row = {"input_ids": ids}
        if prompt > 0:
            row["labels"] = [-100] * prompt + ids[prompt:]
        f.write(json.dumps(row) + "\n")
PY
steps=${GLM_E2E_STEPS:-8}
IFS=$'\n'
for variant in ${GLM_E2E_VARIANTS:-"default;;"}; do
  IFS=';' read -r label envs args <<<"$variant"
  IFS=' ' read -r -a env_list <<<"$envs"
  IFS=' ' read -r -a arg_list <<<"$args"
  # glm_hpc's performance settings are options now, no longer read from the environment: a variant
  # still setting them there would silently measure the defaults.
  stale=$(printf '%s\n' "${env_list[@]}" | grep -E '^GLM_' | grep -v '^GLM_TEST_' | tr '\n' ' ')
  if [ -n "$stale" ]; then
    echo "$label failed: environment settings $stale are glm_hpc options now (the variant's third field)"
    continue
  fi
  dir=/tmp/e2e_$label
  rm -rf "$dir"
  nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits \
    -lms 250 >"$OUT/smi_$label.csv" 2>/dev/null &
  smi=$!
  env "${env_list[@]}" CUDA_VISIBLE_DEVICES=0 mpirun -np 1 --bind-to none build-gpu/glm_hpc --device cuda \
    --config configs/glm4-9b-chat.cfg --num_hidden_layers 12 --dataset "$data" --max_length 4096 \
    --gradient_accumulation_steps 1 --max_steps "$steps" --logging_steps 1 --warmup_steps 0 --save_strategy no \
    --overwrite_output_dir true --output_dir "$dir" "${arg_list[@]}" >"$OUT/e2e_$label.log" 2>&1 || { echo "$label failed"; tail -6 "$OUT/e2e_$label.log"; }
  kill $smi 2>/dev/null
  [ -f "$dir/logging.jsonl" ] || continue
  grep -A40 "^profile: " "$OUT/e2e_$label.log" | head -42
  python3 -c "
import json; r=[json.loads(l) for l in open('$dir/logging.jsonl') if '\"loss\"' in l][3:]
print('e2e %-28s %8.0f tokens/s over %d steps, loss %.5f, grad_norm %.4f, %.1f GiB' % ('$label', sum(x['tokens_per_second'] for x in r)/len(r), len(r), r[-1]['loss'], r[-1]['grad_norm'], max(x.get('device_memory_gib', 0) for x in r)))
period = sum(x['tokens'] / x['tokens_per_second'] for x in r) / len(r)
inside = sum(x['step_seconds'] for x in r) / len(r)
print('   %.2f ms a step, %.2f ms of it in the engine step, %.2f ms outside it' % (period * 1e3, inside * 1e3, (period - inside) * 1e3))"
  # SM clock and power while it ran (samples over 300 W: the training steps, not start-up).
  python3 -c "
rows=[l.split(',') for l in open('$OUT/smi_$label.csv') if l.count(',')==2]
busy=sorted((float(c),float(p),r.strip()) for c,p,r in rows if float(p)>300)
if busy: print('   %d busy samples: SM clock median %.0f MHz (min %.0f), power median %.0f W, throttle reasons %s' % (len(busy), busy[len(busy)//2][0], busy[0][0], sorted(x[1] for x in busy)[len(busy)//2], sorted(set(x[2] for x in busy))))" 2>/dev/null
done
