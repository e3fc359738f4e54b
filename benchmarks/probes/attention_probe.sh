#!/usr/bin/env bash
# One single-H200 call for the flash-attention work: build, the attention ctests (every head size
# against the CPU reference; the wgmma and mma.sync kernels against each other), then
# bench_kernels' attention rows, next to the copy/GEMM ceilings and PyTorch's SDPA (flash backend)
# on the same shapes. GLM_PROBE_E2E=1 adds the 12-layer end-to-end run of perf_probe.sh
# (GLM_PROBE_ARGS="--profile true" for its per-op table, "--attention_kernel mma" for the mma.sync
# kernels end to end).
# bench_kernels runs once with the default kernels (wgmma on sm_90) and once with
# --attention_kernel mma (the mma.sync kernels); GLM_PROBE_KERNEL_FLAGS adds flags to both.
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
for kernel in auto mma; do
  echo "kernels: --attention_kernel $kernel ${GLM_PROBE_KERNEL_FLAGS:-}"
  # shellcheck disable=SC2086  # the flags split into words on purpose
  build-gpu/benchmarks/bench_kernels --attention_kernel $kernel ${GLM_PROBE_KERNEL_FLAGS:-} \
    --benchmark_filter="${GLM_PROBE_FILTER:-Ceiling|Attention}" --benchmark_min_time=0.2s \
    --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_"
done
timeout 120 python3 benchmarks/peers/sdpa_bench.py 2>&1 | tail -6
if [ "${GLM_PROBE_E2E:-0}" = 1 ]; then
  GLM_PROBE_SKIP_GEMM=1 GLM_PROBE_LMHEAD=0 GLM_PROBE_TUNE=off GLM_BUILD_TARGETS=glm_hpc bash benchmarks/probes/perf_probe.sh
fi
