#!/usr/bin/env bash
# One single-H200 call for the GEMM and lm_head work: build, bench_gemm (heuristic against
# autotuned cuBLASLt algorithms on GLM-4-9B shapes) next to PyTorch's matmuls, the fused lm_head +
# cross-entropy, and the 12-layer e2e run per --gemm_autotune setting (GLM_PROBE_TUNE, default
# "off large"; add "all" for every shape). GLM_PROBE_ARGS: more glm_hpc options for the e2e runs
# (e.g. "--profile true" for the per-op table, "--lm_head_scratch_mb 512").
# The lm_head rows run at BackendConfig's default scratch budget (2048 MiB): the budget is glm_hpc's
# --lm_head_scratch_mb now, which bench_kernels does not take, so the old sweep over 512, 2048 and
# 4096 MiB is only possible end to end (GLM_PROBE_ARGS). GLM_PROBE_LMHEAD=0 skips the rows.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="${GLM_BUILD_TARGETS:-glm_hpc bench_gemm bench_kernels}" bash benchmarks/calls/gpu_session.sh || exit 1
if [ "${GLM_PROBE_SKIP_GEMM:-0}" != 1 ]; then
  build-gpu/benchmarks/bench_gemm | tee "$OUT/bench_gemm.log"
  python3 benchmarks/peers/gemm_bench.py | tee "$OUT/gemm_peer.log"
fi
if [ "${GLM_PROBE_LMHEAD:-1}" = 1 ]; then
  echo "lm_head at the default scratch budget:"
  build-gpu/benchmarks/bench_kernels --benchmark_filter='Ceiling|LmHead' \
    --benchmark_min_time=0.2s --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_"
fi
python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/bench4096.jsonl", "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
for tune in ${GLM_PROBE_TUNE-off large}; do
  mpirun --allow-run-as-root -np 1 --bind-to none build-gpu/glm_hpc --device cuda --gemm_autotune "$tune" \
    --config configs/glm4-9b-chat.cfg --num_hidden_layers 12 --dataset /tmp/bench4096.jsonl --max_length 4096 \
    --gradient_accumulation_steps 1 --max_steps 8 --logging_steps 1 --warmup_steps 0 --save_strategy no \
    --overwrite_output_dir true --output_dir /tmp/e2e_tune$tune ${GLM_PROBE_ARGS:-} >"$OUT/e2e_tune$tune.log" 2>&1 || tail -5 "$OUT/e2e_tune$tune.log"
  grep -A40 "^profile: " "$OUT/e2e_tune$tune.log"
  python3 -c "
import json; r=[json.loads(l) for l in open('/tmp/e2e_tune$tune/logging.jsonl')][3:]
print('e2e autotune=$tune: %.0f tokens/s over steps 4-8, loss %.5f' % (sum(x['tokens_per_second'] for x in r)/len(r), r[-1]['loss']))"
done
