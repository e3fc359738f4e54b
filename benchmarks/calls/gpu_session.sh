#!/usr/bin/env bash
# One call on the GPU machine: build (for sm_90a unless GLM_CUDA_ARCHS says otherwise), run the gpu and unit tests, compare the tiny
# model's 50-step loss curve on CUDA with the CPU backend, and time a GLM-4-9B-shaped model cut to
# 12 layers at seq 4096 (micro-batch 1). Prints a short table last; logs go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

# PCRE2 headers are missing on the GPU image: use Debian's libpcre2-dev carried in .deb/.
source benchmarks/calls/device_env.sh

t0=$(date +%s)
# GLM_CUDA_ARCHS picks the architectures (default 90a, the H200's, in a fraction of the fat build's
# time); "default" builds what a user gets (CMakeLists.txt: 8.0 to 9.0a).
archs=(-DCMAKE_CUDA_ARCHITECTURES="${GLM_CUDA_ARCHS:-90a}")
[ "${GLM_CUDA_ARCHS:-}" = default ] && archs=()
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${archs[@]}" "${boost_args[@]}" \
  >"$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
# GLM_BUILD_TARGETS narrows the build (e.g. "bench_comm test_bench_comm" for benchmarks/calls/comm_x2.sh);
# GLM_BUILD_JOBS (default 16) sets the parallelism (the 4- and 8-GPU machines have 64 and 128 cores).
targets=(); for t in ${GLM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build-gpu -j "${GLM_BUILD_JOBS:-16}" "${targets[@]}" -- -k 0 >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
[ "${GLM_ONLY_BUILD:-0}" = 1 ] && exit 0

# NCCL first and on its own, with a hard limit and its full output kept. (The npm tiktoken
# peer tests are left out above: npm cannot be installed on the GPU machine.)
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  NCCL_DEBUG=WARN timeout 240 mpirun -np 2 build-gpu/tests/test_nccl >"$OUT/test_nccl.log" 2>&1
  echo "test_nccl (2 GPUs) rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|error" "$OUT/test_nccl.log" | head -20
fi
(cd build-gpu && ctest -L gpu -E test_nccl --timeout 300 --output-on-failure >"$OUT/ctest_gpu.log" 2>&1; echo "gpu tests rc=$?")
grep -E "tests passed|Failed|\*\*\*|vs transformers|on CUDA" "$OUT/ctest_gpu.log" | head -30
if [ "${GLM_SKIP_UNIT:-0}" != 1 ]; then  # CI runs them too; GLM_SKIP_UNIT=1 saves device time
  (cd build-gpu && ctest -L unit -j 8 -E TiktokenPeer >"$OUT/ctest_unit.log" 2>&1; echo "unit tests rc=$?")
  grep -E "tests passed" "$OUT/ctest_unit.log"
fi

# Tiny model: the same 50 steps on CUDA and on the CPU backend (GLM_SKIP_TINY=1 skips it).
for dev in $([ "${GLM_SKIP_TINY:-0}" = 1 ] || echo cuda cpu); do
  mpirun -np 1 build-gpu/glm_hpc --device $dev --max_steps 50 --logging_steps 1 --overwrite_output_dir true --output_dir /tmp/tiny_$dev \
    >"$OUT/tiny_$dev.log" 2>&1 || { echo "tiny $dev failed"; tail -5 "$OUT/tiny_$dev.log"; }
done

# GLM-4-9B shapes, 12 layers, seq 4096, micro-batch 1, random tokens.
python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/bench4096.jsonl", "w") as f:
    for _ in range(16):
        ids = [random.randrange(151552) for _ in range(4096)]
        f.write(json.dumps({"input_ids": ids}) + "\n")
PY
# Once per recompute policy (GLM_E2E_RECOMPUTE, default all three); "none" is the headline row.
# GLM_E2E_ARGS (default --max_grad_norm 0: the transformers peer does not clip, so neither do we;
# the gradient norm is still computed, inside AdamW) adds options.
read -r -a e2e_args <<<"${GLM_E2E_ARGS---max_grad_norm 0}"
for policy in ${GLM_E2E_RECOMPUTE:-none selective full}; do
  dir=/tmp/e2e; [ "$policy" = none ] || dir=/tmp/e2e_$policy
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/mem_$policy.csv" 2>/dev/null &
  smi=$!
  CUDA_VISIBLE_DEVICES=0 mpirun -np 1 build-gpu/glm_hpc --device cuda --config configs/glm4-9b-chat.cfg \
    --num_hidden_layers 12 --dataset /tmp/bench4096.jsonl --max_length 4096 --gradient_accumulation_steps 1 \
    --max_steps 6 --logging_steps 1 --warmup_steps 0 --recompute $policy --save_strategy no --overwrite_output_dir true --output_dir $dir "${e2e_args[@]}" \
    >"$OUT/e2e_$policy.log" 2>&1 || { echo "e2e $policy failed"; tail -8 "$OUT/e2e_$policy.log"; }
  kill $smi 2>/dev/null
  [ "$policy" = none ] && cp "$OUT/mem_none.csv" "$OUT/mem.csv"
  tail -1 "$OUT/e2e_$policy.log"
done

# Kernels next to the copy and GEMM ceilings; PyTorch SDPA and the transformers peer in the same call.
[ "${GLM_SKIP_KERNELS:-0}" = 1 ] || build-gpu/benchmarks/bench_kernels --benchmark_min_time=0.2s --benchmark_counters_tabular=true \
  >"$OUT/bench_kernels.log" 2>&1 || echo "bench_kernels failed"
grep -E "^BM_|Benchmark" "$OUT/bench_kernels.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-150
if [ "${GLM_SKIP_KERNELS:-0}" != 1 ]; then
  python3 benchmarks/peers/sdpa_bench.py >"$OUT/sdpa.log" 2>&1 || tail -3 "$OUT/sdpa.log"
  grep sdpa "$OUT/sdpa.log"
fi
if [ "${GLM_SKIP_PEERS:-0}" != 1 ]; then
  timeout 420 python3 benchmarks/peers/hf_glm_peer.py >"$OUT/peer.log" 2>&1 || tail -3 "$OUT/peer.log"
  grep "^peer" "$OUT/peer.log"
fi

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def losses(path):  # the training-step records (evaluation records carry no "loss")
    try:
        return [r for r in (json.loads(l) for l in open(path)) if "loss" in r]
    except OSError:
        return []
g, c = losses("/tmp/tiny_cuda/logging.jsonl"), losses("/tmp/tiny_cpu/logging.jsonl")
rows = []
if g and c:
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(g, c))
    rows.append(("tiny 50 steps: loss first/last cuda", f"{g[0]['loss']:.4f} / {g[-1]['loss']:.4f}"))
    rows.append(("tiny 50 steps: loss first/last cpu", f"{c[0]['loss']:.4f} / {c[-1]['loss']:.4f}"))
    rows.append(("tiny: worst relative loss gap", f"{worst:.2e}"))
e = losses("/tmp/e2e/logging.jsonl")
if len(e) > 2:
    steady = e[2:]
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady)
    L, H, S = 12, 4096, 4096
    n_mm = L * 203948032 + 620756992
    flops = 6 * n_mm + 6 * L * H * S  # causal-skipping attention, the peer's convention
    rows.append(("e2e 12L seq4096 tokens/s", f"{tps:.0f}"))
    rows.append(("e2e model TFLOP/s, MFU (989)", f"{tps * flops / 1e12:.1f}, {100 * tps * flops / 989e12:.1f}%"))
    rows.append(("e2e vs peer 20,720 tok/s (issue's number)", f"{tps / 20720:.3f}x"))
    import re
    try:
        peers = {m.group(1): float(m.group(2)) for m in
                 re.finditer(r"peer (\w+): (\d+) tokens/s", open(f"{out}/peer.log").read())}
        if peers:
            best = max(peers.values())
            rows.append(("peer measured now (tokens/s)", ", ".join(f"{k} {v:.0f}" for k, v in peers.items())))
            rows.append(("ours / best peer measured now", f"{tps / best:.3f}x"))
    except OSError:
        pass
for policy, d in (("none", "/tmp/e2e"), ("selective", "/tmp/e2e_selective"), ("full", "/tmp/e2e_full")):
    recs = losses(f"{d}/logging.jsonl")
    try:
        mem = [int(x) for x in open(f"{out}/mem_{policy}.csv").read().split() if x.strip().isdigit()]
    except OSError:
        mem = []
    if len(recs) > 2:
        tps = sum(r["tokens_per_second"] for r in recs[2:]) / len(recs[2:])
        peak = f"{max(mem) / 1024:.1f} GiB" if mem else "?"
        rows.append((f"e2e recompute {policy}: tokens/s, peak (nvidia-smi)",
                     f"{tps:.0f}, {peak}, loss step 1 {recs[0]['loss']:.6f}"))
print("\n== summary ==")
for k, v in rows:
    print(f"{k:45s} {v}")
PY
