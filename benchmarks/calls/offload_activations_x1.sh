#!/usr/bin/env bash
# One call on one H200 for --offload_activations: LoRA steps of the GLM-4-9B-Chat-1M shapes (all 40
# layers, --recompute full) on one row per step, with the layers' inputs on the GPU and in pinned
# host memory at 64k tokens (the speed and memory of both), then at 256k tokens, which one GPU
# holds only with them offloaded; and the 12-layer GLM-4-9B step at seq 4096 with and without them
# (the cost where compute per layer is short). Each run's tokens/s and peak memory
# (logging.jsonl's device_memory_gib, nvidia-smi beside it) next to `plan`'s prediction for the same
# options. A short table comes last. Builds into build-gpu unless GLM_OA_NO_BUILD=1 (a warm machine
# that has it).
#
# GLM_OA_DRY_RUN=1 runs the same steps on the CPU backend with the tiny model and short rows: the
# check, where the code is built, that the script and every option it passes work.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
dry=${GLM_OA_DRY_RUN:-0}
if [ "$dry" = 1 ]; then
  B=${GLM_OA_BUILD:-build-cpu}
  device=cpu
  model=(--config configs/glm4-tiny.cfg --num_hidden_layers 6)
  short_model=(--config configs/glm4-tiny.cfg --num_hidden_layers 4)
  short=256 long=1024 seq=128 long_steps=2
else
  if [ "${GLM_OA_NO_BUILD:-0}" != 1 ]; then
    GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc" bash benchmarks/calls/gpu_session.sh || exit 1
  fi
  B=build-gpu
  device=cuda
  model=(--config configs/glm4-9b-chat-1m.cfg)
  short_model=(--config configs/glm4-9b-chat.cfg --num_hidden_layers 12)
  short=65536 long=262144 seq=4096 long_steps=1
fi
source benchmarks/calls/steps.sh
python3 - "$short" "$long" "$seq" <<'PY'
import json, random, sys
random.seed(0)
for tokens in map(int, sys.argv[1:]):
    with open(f"/tmp/oa_rows_{tokens}.jsonl", "w") as f:
        for _ in range(16 if tokens <= 4096 else 3):
            f.write(json.dumps({"input_ids": [random.randrange(1, 1500) for _ in range(tokens)]}) + "\n")
PY
common=(--recompute full --gradient_accumulation_steps 1 --per_device_train_batch_size 1
  --logging_steps 1 --warmup_steps 0 --save_strategy no --overwrite_output_dir true)
# run NAME TOKENS LIMIT OPTION...: plan the options, then train with them on one GPU.
run() {
  local name=$1 tokens=$2 limit=$3
  shift 3
  local opts=("${common[@]}" "$@" --max_length "$tokens")
  $B/glm_hpc plan "${opts[@]}" --world_size 1 >"$OUT/plan_$name.txt" 2>&1
  local smi=
  if [ "$dry" != 1 ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/smi_$name.csv" 2>/dev/null &
    smi=$!
  fi
  step "$name" "$limit" mpirun -np 1 --bind-to none $B/glm_hpc --device "$device" "${opts[@]}" \
    --dataset "/tmp/oa_rows_$tokens.jsonl" --output_dir "/tmp/oa_$name"
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
}
run seq_kept "$seq" 90 "${short_model[@]}" --max_grad_norm 0 --max_steps 15
run seq_offloaded "$seq" 90 "${short_model[@]}" --max_grad_norm 0 --max_steps 15 --offload_activations true
run lora64k_offloaded "$short" 120 "${model[@]}" --train_type lora --max_steps 2 --offload_activations true
run lora64k_kept "$short" 120 "${model[@]}" --train_type lora --max_steps 2
run lora256k_offloaded "$long" 330 "${model[@]}" --train_type lora --max_steps "$long_steps" --offload_activations true
python3 - "$OUT" "$short" "$long" "$seq" <<'PY'
import json, os, re, sys
out, short, long_, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("== --offload_activations: recompute full, one row per step (seq_*: 12 layers, full fine-tuning) ==")
print("%-20s %8s %10s %13s %13s %11s %11s" % ("run", "row", "tokens/s", "peak (jsonl)", "peak (smi)", "plan", "plan host"))
for name, tokens in (("seq_kept", seq), ("seq_offloaded", seq), ("lora64k_kept", short),
                     ("lora64k_offloaded", short), ("lora256k_offloaded", long_)):
    rows = []
    try:
        rows = [json.loads(l) for l in open(f"/tmp/oa_{name}/logging.jsonl") if '"loss"' in l]
    except OSError:
        pass
    steady = rows[3:] if len(rows) > 6 else (rows[1:] or rows)
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady) if steady else 0
    peak = max((r.get("device_memory_gib", 0) for r in rows), default=0)
    smi = 0
    if os.path.exists(f"{out}/smi_{name}.csv"):
        vals = [int(x) for x in open(f"{out}/smi_{name}.csv").read().split() if x.strip().isdigit()]
        smi = max(vals) / 1024 if vals else 0
    text = open(f"{out}/plan_{name}.txt").read()
    plan = re.search(r"total \(predicted peak\)\s+([\d.]+) GiB", text)
    host = re.search(r"offloaded activations: the layers' inputs \(bf16\)\s+([\d.]+) GiB", text)
    print("%-20s %8d %10.0f %9.1f GiB %9.1f GiB %7s GiB %7s GiB" % (name, tokens, tps, peak, smi,
          plan.group(1) if plan else "?", host.group(1) if host else "0"))
PY
step_table
