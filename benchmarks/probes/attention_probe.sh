#!/usr/bin/env bash
# One single-H200 call for the flash-attention work: build, the attention ctests (every head size
# against the CPU reference; the wgmma and mma.sync kernels against each other), then
# bench_kernels' attention rows with each kernel variant (GLM_PROBE_VARIANTS), next to the
# copy/GEMM ceilings and PyTorch's SDPA (flash backend) on the same shapes. GLM_PROBE_E2E=1 adds
# the 12-layer end-to-end run of perf_probe.sh (GLM_PROFILE=1 for its per-op table).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="${GLM_BUILD_TARGETS:-test_cuda_ops bench_kernels glm_hpc}" \
  bash benchmarks/calls/gpu_session.sh || exit 1
build-gpu/tests/test_cuda_ops --gtest_filter='*Attention*:*Flash*' >"$OUT/attention_tests.log" 2>&1
rc=$?
echo "attention tests rc=$rc"
grep -E "wgmma attention|OK \]|FAILED|Failure|error|Expected|Which is" "$OUT/attention_tests.log" | head -40
[ $rc = 0 ] || exit 1  # no timings of wrong kernels
for choice in ${GLM_PROBE_VARIANTS:-GLM_FLASH=wgmma GLM_FLASH_DQ=atomic GLM_FLASH=mma}; do
  echo "kernels: $choice"
  env "$choice" build-gpu/benchmarks/bench_kernels \
    --benchmark_filter="${GLM_PROBE_FILTER:-Ceiling|Attention}" --benchmark_min_time=0.2s \
    --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_"
done
timeout 120 python3 benchmarks/peers/sdpa_bench.py 2>&1 | tail -6
if [ "${GLM_PROBE_E2E:-0}" = 1 ]; then
  GLM_PROBE_SKIP_GEMM=1 GLM_PROBE_LMHEAD_MB= GLM_PROBE_TUNE=0 GLM_BUILD_TARGETS=glm_hpc bash benchmarks/probes/perf_probe.sh
fi
