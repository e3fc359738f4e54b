#!/usr/bin/env bash
# One single-H200 call for the offloaded optimizer (--offload_optimizer cpu): builds every target,
# runs `ctest -L gpu` (the host AdamW against the kernel bit for bit, the offloaded engine's
# trajectory), times the host AdamW against a STREAM-like copy on the same 16 cores and against
# torch.optim.AdamW on CPU tensors, then trains a GLM-4-9B-shaped model cut to 4 layers at seq 4096,
# ZeRO-1, with the optimizer on the GPU and offloaded (gradient accumulation 1 and 8). Carries .deb.
# Prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source benchmarks/calls/steps.sh
STEP_DEADLINE=$(( $(date +%s) + ${GLM_CALL_SECONDS:-540} ))
step build 300 env GLM_BUILD_JOBS=16 GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="" bash benchmarks/calls/gpu_session.sh ||
  { tail -30 "$OUT/build.log"; step_table; exit 1; }
step ctest_gpu 200 bash -c "cd build-gpu && ctest -L gpu -E test_nccl --timeout 150 --output-on-failure"
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Not Run" "$OUT/ctest_gpu.log" | head -12
cores=$(nproc)
step host_adamw 60 build-gpu/benchmarks/bench_host_adamw --threads "$cores" --elements $((1 << 27)) --repeat 5
step torch_adamw 60 python3 benchmarks/peers/torch_cpu_adamw.py --threads "$cores" --elements $((1 << 27)) --repeat 5
data=/tmp/offload4096.jsonl
python3 - "$data" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(64): f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
train() {  # train NAME GA EXTRA...
  local name=$1 ga=$2; shift 2
  step "$name" 90 mpirun -np 1 --bind-to none build-gpu/glm_hpc --device cuda --config configs/glm4-9b-chat.cfg \
    --num_hidden_layers 4 --dataset "$data" --max_length 4096 --zero_stage 1 --gradient_accumulation_steps "$ga" \
    --max_steps 5 --logging_steps 1 --warmup_steps 0 --save_strategy no --overwrite_output_dir true \
    --output_dir "/tmp/$name" "$@"
}
train gpu_ga1 1
train offload_ga1 1 --offload_optimizer cpu
train offload_ga8 8 --offload_optimizer cpu
step_table
echo "== host AdamW (bench_host_adamw, $cores threads) =="
cat "$OUT/host_adamw.log"
grep -E "torch AdamW|torch_adamw" "$OUT/torch_adamw.log"
OUT=$OUT python3 - <<'PY'
import json, os
out = os.environ["OUT"]
mine = torch = None
for name, key in (("host_adamw", "adamw_melem_per_s"), ("torch_adamw", "torch_adamw_melem_per_s")):
    try:
        for l in open(f"{out}/{name}.log"):
            if l.startswith(key): value = float(l.split()[1]); mine, torch = (value, torch) if name == "host_adamw" else (mine, value)
    except OSError: pass
if mine and torch: print("host AdamW against torch.optim.AdamW (CPU): %.2fx (target >= 5x)" % (mine / torch))
print("\n== GLM-4-9B shapes, 4 layers, seq 4096, ZeRO-1, 1 x H200 ==")
for name in ("gpu_ga1", "offload_ga1", "offload_ga8"):
    try:
        r = [json.loads(l) for l in open(f"/tmp/{name}/logging.jsonl") if '"loss"' in l][1:]
        print("%-12s %8.0f tokens/s over %d steps, loss %.5f -> %.5f, %.1f GiB" % (name, sum(x["tokens_per_second"] for x in r) / len(r), len(r), r[0]["loss"], r[-1]["loss"], max(x.get("device_memory_gib", 0) for x in r)))
    except Exception as e: print(name, "no result:", e)
PY
for name in gpu_ga1 offload_ga1; do grep -m1 "memory per rank" "$OUT/$name.log"; done
