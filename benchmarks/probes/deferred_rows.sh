#!/usr/bin/env bash
# One H200: build, the GPU tests and the tiny model against the CPU, then the 12-layer end-to-end
# step (GLM-4-9B shapes, seq 4096, random tokens, no clipping) with the embedding's untouched rows
# updated every step (--defer_embedding_rows 0) and deferred (the default), over enough steps
# (GLM_E2E_STEPS, default 70) that the deferred run settles every row once (lag bound 64), next
# to the compiled transformers peer; resume on the GPU; a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
# GLM_SKIP_SESSION=1: build-gpu is built and tested already (an earlier call on the same machine).
if [ "${GLM_SKIP_SESSION:-0}" != 1 ]; then
  GLM_SKIP_UNIT=1 GLM_SKIP_KERNELS=1 GLM_SKIP_PEERS=1 GLM_E2E_RECOMPUTE=" " bash benchmarks/calls/gpu_session.sh 2>&1 |
    tee "$OUT/session.log" | tail -25
fi
[ -x build-gpu/glm_hpc ] || exit 1
GLM_E2E_STEPS=${GLM_E2E_STEPS:-70} GLM_E2E_VARIANTS="dense;;--max_grad_norm 0 --defer_embedding_rows 0
deferred;;--max_grad_norm 0" bash benchmarks/probes/e2e_variants.sh 2>&1 | tee "$OUT/ours.log" | grep -E "^e2e|busy samples|failed"
if [ "${GLM_DEFERRED_PROFILE:-1}" = 1 ]; then
  GLM_E2E_STEPS=14 GLM_E2E_VARIANTS="deferred_profile;;--max_grad_norm 0 --profile true" bash benchmarks/probes/e2e_variants.sh \
    2>&1 | tee "$OUT/profile.log" | grep -E "adamw|main_waits|^e2e|total" | head -12
fi
timeout 300 python3 benchmarks/peers/hf_glm_peer.py --modes compile 2>&1 | tee "$OUT/peer.log" | grep -E "^peer|Error" | tail -3
bash benchmarks/checks/resume_cuda.sh 2>&1 | tee "$OUT/resume.log" | tail -4
python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
ours = {m.group(1): float(m.group(2)) for m in re.finditer(r"e2e (\S+)\s+(\d+) tokens/s", open(f"{out}/ours.log").read())}
peer = re.search(r"peer compile\S*: (\d+) tokens/s", open(f"{out}/peer.log").read())
p = float(peer.group(1)) if peer else 0
print("\n== 12 layers, seq 4096, 1 x H200, no clipping: tokens/s ==")
for label in ("dense", "deferred"):
    o = ours.get(label, 0)
    print(f"ours {label:9s} {o:8.0f}  compiled peer {p:8.0f}  ratio {o / p if p else 0:.3f}x")
if ours.get("dense") and ours.get("deferred"):
    print(f"deferred / dense: {ours['deferred'] / ours['dense']:.4f}")
PY
