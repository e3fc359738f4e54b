#!/usr/bin/env bash
# One H200: the GPU tests and the tiny model against the CPU, then the 12-layer end-to-end step
# (GLM-4-9B shapes, seq 4096) on the issue's all-labelled rows and on SFT-shaped rows whose first
# half is prompt (labels -100: the lm_head runs over the labelled rows only), ours and the
# compiled transformers peer on the same rows, in one call. Prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
GLM_SKIP_UNIT=1 GLM_SKIP_KERNELS=1 GLM_SKIP_PEERS=1 GLM_E2E_RECOMPUTE=" " bash benchmarks/calls/gpu_session.sh 2>&1 |
  tee "$OUT/session.log" | tail -25
fraction=${GLM_LABELLED_PROMPT_FRACTION:-0.5}
for f in 0 "$fraction"; do
  GLM_E2E_PROMPT_FRACTION=$f GLM_E2E_STEPS=${GLM_E2E_STEPS:-16} GLM_E2E_VARIANTS="p$f;;--max_grad_norm 0" \
    bash benchmarks/probes/e2e_variants.sh 2>&1 | tee -a "$OUT/ours.log" | grep -E "^e2e|busy samples|failed"
done
for f in 0 "$fraction"; do
  timeout 300 python3 benchmarks/peers/hf_glm_peer.py --modes compile --prompt_fraction "$f" 2>&1 |
    tee -a "$OUT/peer.log" | grep -E "^peer|Error" | tail -3
done
python3 - "$OUT" "$fraction" <<'PY'
import re, sys
out, fraction = sys.argv[1], float(sys.argv[2])
ours = {m.group(1): float(m.group(2)) for m in re.finditer(r"e2e p(\S+)\s+(\d+) tokens/s", open(f"{out}/ours.log").read())}
peer = {m.group(1): float(m.group(2)) for m in re.finditer(r"peer compile(\S*): (\d+) tokens/s", open(f"{out}/peer.log").read())}
print("\n== 12 layers, seq 4096, 1 x H200, no clipping: tokens/s ==")
for label, o, p in (("all rows labelled", ours.get("0"), peer.get("")),
                    (f"first {int(100 * fraction)}% prompt", ours.get(str(sys.argv[2])), peer.get(f"_prompt{int(100 * fraction)}"))):
    ratio = f"{o / p:.3f}x" if o and p else "?"
    print(f"{label:24s} ours {o or 0:8.0f}  compiled peer {p or 0:8.0f}  ratio {ratio}")
PY
