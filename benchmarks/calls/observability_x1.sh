#!/usr/bin/env bash
# One call on one H200 for issue 34's GPU checks: the 12-layer GLM-4-9B-shaped run (seq 4096,
# micro-batch 1, random tokens: gpu_session.sh's end-to-end model) with TensorBoard event files and
# NVML sampling on, against the same run with both off, twice each, interleaved (off, on, off, on),
# in the same call; its tokens/s ratio (target within 1%); the MFU of its log lines against the MFU
# computed here from tokens/s (the benchmarks' FLOP count over the H200's 989 TFLOP/s); the event
# files read back by TensorBoard's own EventAccumulator and compared with logging.jsonl; the
# tensorboard_events ctest on the GPU build; and the charts each run drew. A short table comes last.
#   GLM_OB_NO_BUILD=1   use build-gpu as it is
#   GLM_OB_STEPS        steps a run (default 40; tokens/s is the mean over steps 6 to the end)
# GLM_OB_DRY_RUN=1: the same steps on the CPU backend with build-cpu and the embedded tiny model, the
# check, where the code is built, that the script works (EventAccumulator skipped without tensorboard).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source benchmarks/calls/steps.sh
export STEP_DEADLINE=${STEP_DEADLINE:-$(($(date +%s) + 575))}
dry=${GLM_OB_DRY_RUN:-0}
steps=${GLM_OB_STEPS:-40}
if [ "$dry" = 1 ]; then
  B=build-cpu
  model=(--device cpu --max_length 128 --max_steps 12)
  steps=12
else
  B=build-gpu
  if [ "${GLM_OB_NO_BUILD:-0}" != 1 ]; then
    GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc" bash benchmarks/calls/gpu_session.sh || exit 1
  fi
  grep -o "TensorBoard event files O[NF]*[^)]*)" "$OUT/cmake.log" 2>/dev/null | head -1
  /usr/bin/env python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/bench4096.jsonl", "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
  model=(--device cuda --config configs/glm4-9b-chat.cfg --num_hidden_layers 12 --dataset /tmp/bench4096.jsonl
    --max_length 4096 --max_steps "$steps" --max_grad_norm 0)
fi
source benchmarks/calls/device_env.sh >/dev/null 2>&1 || true  # protoc for the ctest below (GPU image)
W=/tmp/observability
rm -rf "$W"
mkdir -p "$W"
common=("${model[@]}" --logging_steps 1 --warmup_steps 0 --save_strategy no --overwrite_output_dir true)
off=(--report_to none --log_gpu_health false --plot_format none)
on=(--report_to tensorboard --log_gpu_health true)
for i in 1 2; do
  step "off_$i" 150 mpirun -np 1 $B/glm_hpc "${common[@]}" "${off[@]}" --output_dir "$W/off_$i"
  step "on_$i" 150 mpirun -np 1 $B/glm_hpc "${common[@]}" "${on[@]}" --output_dir "$W/on_$i"
done
[ "$dry" = 1 ] || step ctest_tensorboard 120 bash -c "cd $B && ctest -R tensorboard_events --output-on-failure"
if python3 -c "import tensorboard" 2>/dev/null; then
  step event_accumulator 60 python3 benchmarks/checks/tensorboard_accumulator.py "$W/on_2"
else
  step_rows+=("$(printf '%-28s %-9s %5s' event_accumulator "not run" "(no tensorboard package here)")")
fi
cp -r "$W/on_2/images" "$OUT/on_2_images" 2>/dev/null
for r in off_1 on_1 off_2 on_2; do cp "$W/$r/logging.jsonl" "$OUT/$r.logging.jsonl" 2>/dev/null; done
grep -h "NVML\|no GPU health\|MFU is\|plots (" "$OUT/on_2.log" | head -4
tail -2 "$OUT/on_2.log" | cut -c1-300

python3 - "$W" "$dry" <<'PY'
import json, statistics, sys
w, dry = sys.argv[1], sys.argv[2] == "1"
def steady(run):
    try:
        recs = [r for r in (json.loads(l) for l in open(f"{w}/{run}/logging.jsonl")) if "loss" in r]
    except OSError:
        return None, []
    return (statistics.mean(r["tokens_per_second"] for r in recs[5:]) if len(recs) > 5 else None), recs
tps = {}
for run in ("off_1", "on_1", "off_2", "on_2"):
    tps[run], recs = steady(run)
    if run == "on_2":
        last = recs
print("\n== issue 34 on one H200: TensorBoard + NVML on vs off (12 layers, seq 4096) ==" if not dry else "\n== dry run ==")
for run, v in tps.items():
    print(f"{run:8s} tokens/s {v:,.0f}" if v else f"{run:8s} no steady steps")
if all(tps.values()):
    off = (tps["off_1"] + tps["off_2"]) / 2
    on = (tps["on_1"] + tps["on_2"]) / 2
    print(f"on / off tokens/s: {on / off:.4f} (pairs {tps['on_1'] / tps['off_1']:.4f}, {tps['on_2'] / tps['off_2']:.4f}); target >= 0.99")
if last and not dry:
    L, H, S = 12, 4096, 4096
    flops = 6 * (L * 203948032 + 620756992) + 6 * L * H * S
    mfu_log = statistics.mean(r["mfu"] for r in last[5:] if "mfu" in r)
    mfu_here = statistics.mean(r["tokens_per_second"] for r in last[5:]) * flops / 989e12
    print(f"MFU: log {100 * mfu_log:.2f}%, computed from tokens/s {100 * mfu_here:.2f}% (ratio {mfu_log / mfu_here:.4f})")
if last:
    r = last[-1]
    keys = [k for k in r if k.startswith("gpu_")]
    print("last record's GPU fields:", {k: r[k] for k in keys} or "none")
PY
step_table
