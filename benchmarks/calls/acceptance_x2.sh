#!/usr/bin/env bash
# One call on the 2 x H200 machine: build for sm_90a, the NCCL and GPU tests, a rank SIGKILLed on
# GPUs, bench_comm's small-message latency, the HF export checked by transformers, the kernel table
# next to SDPA, and the 12-layer end-to-end run next to the transformers peer (eager and compiled)
# in the same call. Every piece has its own time limit; a short table comes last. Logs go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 bash benchmarks/calls/gpu_session.sh || exit 1
B=build-gpu
source benchmarks/calls/steps.sh  # step NAME SECONDS COMMAND...: own limit, log in $OUT/NAME.log, a row in the table
step test_nccl 240 mpirun -np 2 --bind-to none $B/tests/test_nccl
grep -E "^\[  (PASSED|FAILED) " "$OUT/test_nccl.log" | head -4
step ctest_gpu 300 bash -c "cd $B && ctest -L gpu -E test_nccl --output-on-failure"
grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest_gpu.log" | head -20
step kill_on_gpus 120 $B/tests/test_cli --gtest_filter='CliFaults.KilledRankEndsTheJobOnGpus'
grep -E "OK \]|FAILED|SKIPPED" "$OUT/kill_on_gpus.log" | head -3
step bench_comm_small 120 mpirun -np 2 --bind-to none $B/benchmarks/bench_comm --backend nccl --dtype bf16 --min_bytes 1K --max_bytes 16M
grep -vE "^#|^$" "$OUT/bench_comm_small.log" | head -40 | cut -c1-120
step export_check 240 env DEVICE=cuda bash benchmarks/checks/export_check.sh $B
tail -8 "$OUT/export_check.log"
step bench_kernels 240 $B/benchmarks/bench_kernels --benchmark_min_time=0.2s --benchmark_counters_tabular=true
grep -E "^BM_|Benchmark" "$OUT/bench_kernels.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-150
step sdpa 120 python3 benchmarks/peers/sdpa_bench.py
grep sdpa "$OUT/sdpa.log"
python3 - <<'PY'
import json, random
random.seed(0)
with open("/tmp/bench4096.jsonl", "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/mem_e2e.csv" 2>/dev/null &
smi=$!
step e2e 180 env CUDA_VISIBLE_DEVICES=0 mpirun -np 1 $B/glm_hpc --device cuda --config configs/glm4-9b-chat.cfg \
  --num_hidden_layers 12 --dataset /tmp/bench4096.jsonl --max_length 4096 --gradient_accumulation_steps 1 \
  --max_steps 8 --logging_steps 1 --warmup_steps 0 --save_strategy no --overwrite_output_dir true --output_dir /tmp/e2e
kill $smi 2>/dev/null
step peer ${GLM_PEER_LIMIT:-300} env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/peers/hf_glm_peer.py
grep "^peer" "$OUT/peer.log"
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
rows = []
try:
    e = [json.loads(l) for l in open("/tmp/e2e/logging.jsonl") if '"loss"' in l]
    steady = e[2:]
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady)
    L, H, S = 12, 4096, 4096
    flops = 6 * (L * 203948032 + 620756992) + 6 * L * H * S
    mem = [int(x) for x in open(f"{out}/mem_e2e.csv").read().split() if x.strip().isdigit()]
    rows.append(("e2e 12L seq4096 tokens/s, MFU, peak", f"{tps:.0f}, {100 * tps * flops / 989e12:.1f}%, "
                 f"{max(mem) / 1024 if mem else 0:.1f} GiB (nvidia-smi)"))
    peers = {m.group(1): float(m.group(2)) for m in
             re.finditer(r"peer (\w+): (\d+) tokens/s", open(f"{out}/peer.log").read())}
    if peers:
        rows.append(("peer (tokens/s)", ", ".join(f"{k} {v:.0f}" for k, v in peers.items())))
        rows.append(("ours / best peer, same call", f"{tps / max(peers.values()):.3f}x"))
except (OSError, ValueError, ZeroDivisionError) as err:
    rows.append(("e2e summary", f"unavailable: {err}"))
for k, v in rows:
    print(f"{k:40s} {v}")
PY
step_table
