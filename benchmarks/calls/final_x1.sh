#!/usr/bin/env bash
# One single-H200 call for the headline ratio of issue 4: build glm_hpc and bench_kernels, the
# kernel table (attention, lm_head, AdamW, ceilings), PyTorch SDPA (flash and cuDNN backends), then
# ours (no clipping, as the peer: with the optimizer beside backward, the default there, after it,
# with the large GEMMs' algorithms tuned under load (--gemm_autotune large), and with every
# embedding row updated every step instead of deferred; and with clipping) and the
# transformers peer
# (eager, compiled)
# side by side, each with the SM clock it ran at. Prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc bench_kernels" bash benchmarks/calls/gpu_session.sh || exit 1
build-gpu/benchmarks/bench_kernels --benchmark_filter="${GLM_FINAL_KERNELS:-Ceiling|Attention|LmHead|AdamW}" \
  --benchmark_min_time=0.2s --benchmark_counters_tabular=true 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^BM_" |
  tee "$OUT/kernels.log"
timeout 120 python3 benchmarks/peers/sdpa_bench.py flash cudnn 2>&1 | grep sdpa | tee "$OUT/sdpa.log"
# 70 steps (GLM_E2E_STEPS): the deferred embedding rows settle every row once inside them (lag 64).
# GLM_FINAL_VARIANTS replaces the variants (e2e_variants.sh's format: "label;environment;glm_hpc options",
# one a line; the options are appended to glm_hpc's command line).
default_variants=$'noclip;;--max_grad_norm 0\nnoclip_tuned;;--max_grad_norm 0 --gemm_autotune large\nnoclip_dense;;--max_grad_norm 0 --defer_embedding_rows 0\nnoclip_after;;--max_grad_norm 0 --optimizer_in_backward false\nclip;;--max_grad_norm 1'
GLM_E2E_STEPS=${GLM_E2E_STEPS:-70} GLM_E2E_VARIANTS="${GLM_FINAL_VARIANTS:-$default_variants}" \
  bash benchmarks/probes/e2e_variants.sh 2>&1 |
  tee "$OUT/ours.log" | grep -E "^e2e|busy samples"
nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 250 >"$OUT/smi_peer.csv" 2>/dev/null &
smi=$!
timeout 400 python3 benchmarks/peers/hf_glm_peer.py >"$OUT/peer.log" 2>&1 || tail -3 "$OUT/peer.log"
kill $smi 2>/dev/null
grep "^peer" "$OUT/peer.log"
python3 - "$OUT" <<'PY'
import re, statistics, sys
out = sys.argv[1]
ours = {m.group(1): float(m.group(2)) for m in re.finditer(r"e2e (\w+)\s+(\d+) tokens/s", open(f"{out}/ours.log").read())}
peers = {m.group(1): float(m.group(2)) for m in re.finditer(r"peer (\w+): (\d+) tokens/s", open(f"{out}/peer.log").read())}
clocks = [float(l.split(",")[0]) for l in open(f"{out}/smi_peer.csv") if l.strip() and float(l.split(",")[1]) > 300]
print("\n== summary (1 x H200, 12 layers, seq 4096) ==")
for k, v in ours.items(): print(f"ours {k:10s} {v:8.0f} tokens/s")
for k, v in peers.items(): print(f"peer {k:10s} {v:8.0f} tokens/s")
if clocks: print(f"peer busy SM clock median {statistics.median(clocks):.0f} MHz")
if ours and peers:
    best = max(peers.values())
    for k, v in ours.items(): print(f"ours {k} / best peer: {v / best:.3f}x")
PY
