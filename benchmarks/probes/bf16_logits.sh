#!/usr/bin/env bash
# One H200 (session 12): build, the GPU tests and the tiny model against the CPU; the lm_head +
# cross-entropy kernel row with bf16 logits; cuBLASLt's candidates for the step's GEMMs timed at
# the power-capped clock (gemm_sustained); the 12-layer end-to-end step (no clipping, 70 steps) and
# its per-op profile, next to the compiled transformers peer. A short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
if [ "${GLM_SKIP_SESSION:-0}" != 1 ]; then
  GLM_SKIP_UNIT=1 GLM_SKIP_KERNELS=1 GLM_SKIP_PEERS=1 GLM_E2E_RECOMPUTE=" " bash benchmarks/calls/gpu_session.sh 2>&1 |
    tee "$OUT/session.log" | tail -20
fi
[ -x build-gpu/glm_hpc ] || exit 1
build-gpu/benchmarks/bench_kernels --benchmark_filter="Ceiling|LmHead" --benchmark_min_time=0.2s \
  --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_" | tee "$OUT/kernels.log"
if [ "${GLM_SKIP_SURVEY:-0}" != 1 ]; then
  timeout 150 build-gpu/benchmarks/gemm_sustained "${GLM_SURVEY_SECONDS:-0.25}" "${GLM_SURVEY_CANDIDATES:-10}" \
    >"$OUT/gemm_sustained.log" 2>&1
  grep -E "^[a-z0-9]|sustained" "$OUT/gemm_sustained.log" | head -200
fi
GLM_E2E_STEPS=${GLM_E2E_STEPS:-70} GLM_E2E_VARIANTS="${GLM_E2E_VARIANTS:-noclip;;--max_grad_norm 0}" \
  bash benchmarks/probes/e2e_variants.sh 2>&1 | tee "$OUT/ours.log" | grep -E "^e2e|busy samples|failed"
if [ "${GLM_E2E_PROFILE:-1}" = 1 ]; then
  GLM_E2E_STEPS=14 GLM_E2E_VARIANTS="profile;;--max_grad_norm 0 --profile true" bash benchmarks/probes/e2e_variants.sh \
    2>&1 | tee "$OUT/profile.log" | grep -vE "^e2e|busy" | head -40
fi
timeout 300 python3 benchmarks/peers/hf_glm_peer.py --modes compile 2>&1 | tee "$OUT/peer.log" | grep -E "^peer|Error" | tail -3
python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
ours = {m.group(1): float(m.group(2)) for m in re.finditer(r"e2e (\S+)\s+(\d+) tokens/s", open(f"{out}/ours.log").read())}
peer = re.search(r"peer compile\S*: (\d+) tokens/s", open(f"{out}/peer.log").read())
p = float(peer.group(1)) if peer else 0
print("\n== 12 layers, seq 4096, 1 x H200, no clipping: tokens/s ==")
for label, o in ours.items():
    print(f"ours {label:12s} {o:8.0f}  compiled peer {p:8.0f}  ratio {o / p if p else 0:.3f}x")
PY
