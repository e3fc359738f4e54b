#!/usr/bin/env bash
# One call on the 2 x H200 machine for context parallelism: the build, the NCCL trajectory test of
# --context_parallel_size 2 against one GPU, then LoRA steps of the GLM-4-9B-Chat-1M shapes (12
# layers, --recompute full) on one row per step: a 64k-token row on one GPU (C = 1) and over two
# (C = 2), and a 256k-token row, which one GPU cannot hold, over two; then full fine-tuning at ZeRO-3
# of a 128k-token row over two. Each run's tokens/s and peak
# memory (logging.jsonl's device_memory_gib, nvidia-smi beside it) next to `plan`'s prediction for
# the same options. A short table comes last.
#
# GLM_CP_DRY_RUN=1 runs the same steps on the CPU backend with the tiny model and short rows: the
# check, where the code is built, that the script and every option it passes work.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
dry=${GLM_CP_DRY_RUN:-0}
if [ "$dry" = 1 ]; then
  B=${GLM_CP_BUILD:-build-cpu}
  device=cpu
  model=(--config configs/glm4-tiny.cfg)
  short=256 long=1024 full=512 test_limit=120
else
  GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc test_nccl" bash benchmarks/calls/gpu_session.sh || exit 1
  B=build-gpu
  device=cuda
  model=(--config configs/glm4-9b-chat-1m.cfg --num_hidden_layers 12)
  short=65536 long=262144 full=131072 test_limit=240
fi
source benchmarks/calls/steps.sh
if [ "$dry" = 1 ]; then
  step test_context_parallel "$test_limit" bash -c "cd $B && ctest -R 'test_context_parallel_mpi_np2'"
else
  step test_nccl "$test_limit" mpirun -np 2 --bind-to none $B/tests/test_nccl --gtest_filter='NcclContextParallel.*'
fi
python3 - "$short" "$long" "$full" <<'PY'
import json, random, sys
random.seed(0)
for tokens in map(int, sys.argv[1:]):
    with open(f"/tmp/cp_rows_{tokens}.jsonl", "w") as f:
        for _ in range(4):
            f.write(json.dumps({"input_ids": [random.randrange(1, 1500) for _ in range(tokens)]}) + "\n")
PY
common=(--recompute full --gradient_accumulation_steps 1 --per_device_train_batch_size 1
  --logging_steps 1 --warmup_steps 0 --save_strategy no)
# run NAME RANKS TOKENS OPTION...: plan the options, then train with them.
run() {
  local name=$1 ranks=$2 tokens=$3
  shift 3
  local opts=("${model[@]}" "${common[@]}" "$@" --max_length "$tokens" --context_parallel_size "$ranks")
  $B/glm_hpc plan "${opts[@]}" --world_size "$ranks" >"$OUT/plan_$name.txt" 2>&1
  local smi=
  if [ "$dry" != 1 ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/smi_$name.csv" 2>/dev/null &
    smi=$!
  fi
  rm -rf "/tmp/cp_$name"
  step "$name" 240 mpirun -np "$ranks" --bind-to none $B/glm_hpc --device "$device" "${opts[@]}" \
    --dataset "/tmp/cp_rows_$tokens.jsonl" --output_dir "/tmp/cp_$name"
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
}
# The 256k row's attention alone is about a minute a step here (mma.sync kernels): two steps.
run cp1_short 1 "$short" --train_type lora --max_steps 4
run cp2_short 2 "$short" --train_type lora --max_steps 4
run cp2_long 2 "$long" --train_type lora --max_steps 2
run cp2_full 2 "$full" --train_type full --zero_stage 3 --max_steps 3
python3 - "$OUT" "$short" "$long" "$full" <<'PY'
import json, os, re, sys
out, short, long_, full = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("== context parallelism: recompute full, one row per step (LoRA; cp2_full: full fine-tuning, ZeRO-3) ==")
print("%-10s %9s %10s %14s %14s %14s" % ("run", "row", "tokens/s", "peak (jsonl)", "peak (smi)", "plan"))
for name, tokens in (("cp1_short", short), ("cp2_short", short), ("cp2_long", long_), ("cp2_full", full)):
    rows = []
    try:
        rows = [json.loads(l) for l in open(f"/tmp/cp_{name}/logging.jsonl") if '"loss"' in l]
    except OSError:
        pass
    steady = rows[1:] or rows
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady) if steady else 0
    peak = max((r.get("device_memory_gib", 0) for r in rows), default=0)
    smi = 0
    if os.path.exists(f"{out}/smi_{name}.csv"):
        vals = [int(x) for x in open(f"{out}/smi_{name}.csv").read().split() if x.strip().isdigit()]
        smi = max(vals) / 1024 if vals else 0
    plan = re.search(r"total \(predicted peak\)\s+([\d.]+) GiB", open(f"{out}/plan_{name}.txt").read())
    print("%-10s %9d %10.0f %10.1f GiB %10.1f GiB %10s GiB" % (name, tokens, tps, peak, smi, plan.group(1) if plan else "?"))
PY
step_table
