#!/usr/bin/env bash
# One call on the 2 x H200 machine for the offloaded optimizer: full fine-tuning of GLM-4-9B-Chat
# (40 layers, seq 4096, --recompute full) at world 2, ZeRO-3, with the optimizer on the GPUs and
# offloaded to the host (gradient accumulation 1 and 16), and at 16 with the parameters offloaded
# too, without and with the delayed update, each run's tokens/s and peak memory
# (logging.jsonl's device_memory_gib, nvidia-smi beside it) next to `plan`'s prediction, and the
# PyTorch peer: FSDP2 with CPUOffloadPolicy and checkpointing on the same shapes
# (benchmarks/peers/hf_glm_fsdp_peer.py --modes offload). A short table comes last.
#
# GLM_OFFLOAD_DRY_RUN=1 runs the same steps on the CPU backend with the tiny model (no peer): the
# check, where the code is built, that the script and every option it passes work.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
dry=${GLM_OFFLOAD_DRY_RUN:-0}
if [ "$dry" = 1 ]; then
  B=${GLM_OFFLOAD_BUILD:-build-cpu}
  device=cpu
  model=(--config configs/glm4-tiny.cfg)
  seq=256
else
  GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc" bash benchmarks/calls/gpu_session.sh || exit 1
  B=build-gpu
  device=cuda
  model=(--config configs/glm4-9b-chat.cfg)
  seq=4096
fi
source benchmarks/calls/steps.sh
python3 - "$seq" <<'PY'
import json, random, sys
random.seed(0)
seq = int(sys.argv[1])
with open("/tmp/offload_rows.jsonl", "w") as f:
    for _ in range(256):
        f.write(json.dumps({"input_ids": [random.randrange(1, 1500) for _ in range(seq)]}) + "\n")
PY
common=(--zero_stage 3 --recompute full --per_device_train_batch_size 1 --max_length "$seq" --logging_steps 1
  --warmup_steps 0 --save_strategy no --max_steps 4)
# run NAME GA OPTION...: plan the options, then train with them on two ranks.
run() {
  local name=$1 ga=$2
  shift 2
  local opts=("${model[@]}" "${common[@]}" --gradient_accumulation_steps "$ga" "$@")
  $B/glm_hpc plan "${opts[@]}" --world_size 2 --gpus_per_node 2 >"$OUT/plan_$name.txt" 2>&1
  local smi=
  if [ "$dry" != 1 ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/smi_$name.csv" 2>/dev/null &
    smi=$!
  fi
  rm -rf "/tmp/offload_$name"
  step "$name" 300 mpirun -np 2 --bind-to none $B/glm_hpc --device "$device" "${opts[@]}" \
    --dataset /tmp/offload_rows.jsonl --output_dir "/tmp/offload_$name"
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
}
run gpu_ga1 1
run offload_ga1 1 --offload_optimizer cpu
run offload_ga16 16 --offload_optimizer cpu
run params_ga16 16 --offload_optimizer cpu --offload_param cpu
run delayed_ga16 16 --offload_optimizer cpu --offload_param cpu --offload_delayed_update true \
  --offload_delayed_update_after 1
if [ "$dry" != 1 ]; then
  step peer_fsdp2_offload 300 torchrun --nproc_per_node 2 benchmarks/peers/hf_glm_fsdp_peer.py --modes offload \
    --steps 3 --warmup 1
fi
python3 - "$OUT" <<'PY'
import json, os, re, sys
out = sys.argv[1]
print("== GLM-4-9B-Chat full fine-tuning, world 2, ZeRO-3, recompute full (tokens/s per GPU) ==")
print("%-14s %10s %14s %14s %14s %16s" % ("run", "tokens/s", "peak (jsonl)", "peak (smi)", "plan", "host plan/node"))
for name in ("gpu_ga1", "offload_ga1", "offload_ga16", "params_ga16", "delayed_ga16"):
    rows = []
    try:
        rows = [json.loads(l) for l in open(f"/tmp/offload_{name}/logging.jsonl") if '"loss"' in l]
    except OSError:
        pass
    steady = rows[1:] or rows
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady) / 2 if steady else 0
    peak = max((r.get("device_memory_gib", 0) for r in rows), default=0)
    smi = 0
    if os.path.exists(f"{out}/smi_{name}.csv"):
        vals = [int(x) for x in open(f"{out}/smi_{name}.csv").read().split() if x.strip().isdigit()]
        smi = max(vals) / 1024 if vals else 0
    text = open(f"{out}/plan_{name}.txt").read()
    plan = re.search(r"total \(predicted peak\)\s+([\d.]+) GiB", text)
    host = re.search(r"per node of \d+ GPUs?\s+([\d.]+) GiB", text)
    print("%-14s %10.0f %10.1f GiB %10.1f GiB %10s GiB %12s GiB" % (name, tps, peak, smi, plan.group(1) if plan else "?",
          host.group(1) if host else "-"))
try:
    print(open(f"{out}/peer_fsdp2_offload.log").read().strip().splitlines()[-1])
except (OSError, IndexError):
    pass
PY
step_table
