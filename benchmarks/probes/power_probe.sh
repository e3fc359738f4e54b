#!/usr/bin/env bash
# The step is power-bound (the H200 runs at its 700 W cap): running work beside other work gains
# only as much as the two leave of the cap unused. This call measures each kernel family alone for
# a few seconds (nvidia-smi every 50 ms: median power and SM clock), then the 12-layer end-to-end
# step with its per-op profile (--profile true), which includes how long the main stream waits for
# the optimizer's side work after backward ("main_waits_for_side"). One H200.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc bench_kernels" bash benchmarks/calls/gpu_session.sh || exit 1
summary="$OUT/power_summary.txt"
: >"$summary"
for f in ${GLM_POWER_KERNELS:-CeilingCopy CeilingGemm AdamWSplitMaster AttentionForward/4096 AttentionBackward/4096 LmHeadCrossEntropy/4096 SwigluForward/4096}; do
  name=${f//\//_}
  nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 >"$OUT/pw_$name.csv" 2>/dev/null &
  smi=$!
  build-gpu/benchmarks/bench_kernels --benchmark_filter="^BM_$f/" --benchmark_min_time="${GLM_POWER_SECONDS:-4}s" \
    --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_" >"$OUT/bm_$name.txt"
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  python3 - "$OUT/pw_$name.csv" "$OUT/bm_$name.txt" "$f" >>"$summary" <<'PY'
import statistics, sys
rows = [l.split(",") for l in open(sys.argv[1]) if l.count(",") == 1]
busy = [(float(c), float(p)) for c, p in rows if float(p) > 150]
bm = open(sys.argv[2]).read().split("\n")[0].split()
t = " ".join(bm[1:3]) if len(bm) > 2 else "?"
if busy:
    print("%-28s %-14s %4d samples: power median %5.0f W (max %5.0f), SM clock median %5.0f MHz" % (
        sys.argv[3], t, len(busy), statistics.median(p for _, p in busy), max(p for _, p in busy),
        statistics.median(c for c, _ in busy)))
PY
done
[ "${GLM_POWER_E2E:-}" = none ] || GLM_E2E_STEPS=${GLM_E2E_STEPS:-12} GLM_E2E_VARIANTS=${GLM_POWER_E2E:-$'profile;;--max_grad_norm 0 --profile true\nnoclip;;--max_grad_norm 0'} \
  bash benchmarks/probes/e2e_variants.sh 2>&1 | tee "$OUT/e2e.log"
echo "== kernels alone (one H200) =="
cat "$summary"
