#!/usr/bin/env bash
# One single-H200 call: the wgmma attention backward's variants side by side (bench_kernels,
# GLM-4-9B attention shapes at seq 4096 and 8192), after the attention tests on the GPU. Each
# variant is a set of bench_kernels flags (BackendConfig's kernel choices; GLM_BWD_VARIANTS, lines
# "name;--flag value --flag value"); the default runs first and last, to show the drift between.
# GLM_BWD_TARGETS replaces the build targets (add glm_hpc for e2e_variants.sh after it). Prints a
# table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="${GLM_BWD_TARGETS:-bench_kernels test_cuda_ops}" bash benchmarks/calls/gpu_session.sh || exit 1
build-gpu/tests/test_cuda_ops --gtest_filter="${GLM_BWD_TESTS:-*Flash*:*Attention*}" 2>&1 | tee "$OUT/attn_tests.log" |
  grep -E "^\[  (PASSED|FAILED) |FAILED|Failure" | head -20
default_variants=$'default;\nhead_chunk_4;--attention_backward_head_chunk 4\npaired_dq;--attention_dq_vector_atomics false\nmma;--attention_kernel mma\ndefault_again;'
: >"$OUT/variants.log"
while IFS=';' read -r name flags; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086  # the flags split into words on purpose
  build-gpu/benchmarks/bench_kernels $flags --benchmark_filter="AttentionBackward" --benchmark_min_time=0.3s \
    --benchmark_repetitions="${GLM_BWD_REPS:-3}" --benchmark_report_aggregates_only=true 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_.*_median" | awk -v n="$name" '{print n, $1, $2, $3}' | tee -a "$OUT/variants.log"
done <<<"${GLM_BWD_VARIANTS:-$default_variants}"
echo "== attention backward variants (ms, median of repetitions) =="
awk '{split($2, a, "/"); t[$1 "," a[2]] = $3; if (!($1 in seen)) {seen[$1] = 1; order[++k] = $1}}
  END {printf "%-16s %8s %8s\n", "variant", "4096", "8192"; for (i = 1; i <= k; i++) printf "%-16s %8s %8s\n", order[i], t[order[i] ",4096"], t[order[i] ",8192"]}' "$OUT/variants.log"
