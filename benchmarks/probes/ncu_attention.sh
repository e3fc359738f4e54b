#!/usr/bin/env bash
# One single-H200 call: Nsight Compute on the wgmma flash-attention kernels at GLM-4-9B's shapes
# (seq GLM_NCU_SEQ, default 4096; 32 query heads, 2 KV heads, head_dim 128), one launch each, with
# the full section set; the details page, the per-instruction (SASS) source page with its stall
# samples, and the kernels' SASS go to $OUT. Clocks are left alone (--clock-control none).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="${GLM_BUILD_TARGETS:-bench_kernels}" bash benchmarks/calls/gpu_session.sh || exit 1
seq=${GLM_NCU_SEQ:-4096}
for k in ${GLM_NCU_KERNELS:-flash_backward_wgmma flash_forward_wgmma}; do
  case $k in *backward*) bm=BM_AttentionBackward ;; *) bm=BM_AttentionForward ;; esac
  timeout 300 ncu --clock-control none --set full --import-source no --kernel-name "regex:$k" --launch-skip 2 \
    --launch-count 1 -f -o "$OUT/$k" build-gpu/benchmarks/bench_kernels --benchmark_filter="$bm/$seq/" \
    --benchmark_min_time=0.01s >"$OUT/$k.run.log" 2>&1
  echo "$k: ncu rc=$?"
  ncu -i "$OUT/$k.ncu-rep" --page details >"$OUT/$k.details.txt" 2>&1
  ncu -i "$OUT/$k.ncu-rep" --page source --csv --print-source sass >"$OUT/$k.sass.csv" 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Shared Memory|L2 Hit|Executed Ipc" \
    "$OUT/$k.details.txt" | head -30
done
cuobjdump -sass build-gpu/benchmarks/bench_kernels 2>/dev/null | awk '/Function : .*flash_(back|for)ward_wgmma/{p=1} /Function : /&&!/wgmma/{p=0} p' \
  >"$OUT/wgmma_kernels.sass" || true
wc -l "$OUT/wgmma_kernels.sass"
