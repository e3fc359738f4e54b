#!/usr/bin/env bash
# Checkpoint write speed against the disk (issue 7's performance target: at least 50% of the disk's
# sequential rate). (a) dd with direct I/O measures the disk where the checkpoint goes; (b) glm_hpc
# trains GLM-4-9B-Chat's real shapes (random init, ZeRO-3, one rank per GPU) for 2 steps and saves
# one checkpoint (~113 GB of fp32 master weights and Adam moments); (c) a table: checkpoint bytes,
# seconds and GB/s from the run's logging.jsonl against dd's GB/s. The checkpoint is deleted after.
#
# 2 x H200:   bash benchmarks/calls/checkpoint_write_x2.sh            (needs build-gpu/ from gpu_session.sh)
# Small CPU run of the same measurement (the dev box), e.g.:
#   GLM_DEVICE=cpu GLM_NP=1 GLM_BIN=build-ckpt/glm_hpc GLM_DD_COUNT=24 GLM_MODEL_ARGS="--hidden_size 1024 \
#   --intermediate_size 2816 --num_hidden_layers 8 --num_attention_heads 8 --num_key_value_heads 2 --head_dim 128" \
#   GLM_MAX_LENGTH=128 bash benchmarks/calls/checkpoint_write_x2.sh
# Env: CKPT_DIR (default /tmp/ckpt_write: must be on the disk under test), GLM_DD_COUNT (64 MiB blocks,
# default 160 = 10 GiB), GLM_KEEP=1 keeps the checkpoint.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$(dirname "$0")/../.."
dir=${CKPT_DIR:-/tmp/ckpt_write}
device=${GLM_DEVICE:-cuda}
bin=${GLM_BIN:-build-gpu/glm_hpc}
np=${GLM_NP:-$( [ "$device" = cuda ] && nvidia-smi -L | wc -l || echo 2)}
model_args=${GLM_MODEL_ARGS:---config configs/glm4-9b-chat.cfg}
max_length=${GLM_MAX_LENGTH:-4096}
count=${GLM_DD_COUNT:-160}
[ -x "$bin" ] || { echo "error: $bin not built (bash benchmarks/calls/gpu_session.sh builds build-gpu/)"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir" || { echo "error: cannot create $dir"; exit 1; }

# (a) the disk: sequential direct writes, then the file is removed.
dd_line=$(dd if=/dev/zero of="$dir/dd.bin" bs=64M count="$count" oflag=direct 2>&1 | tail -n 1)
rm -f "$dir/dd.bin"
dd_bytes=$(awk '{print $1}' <<<"$dd_line")
dd_seconds=$(sed -E 's/.* copied, ([0-9.]+) s.*/\1/' <<<"$dd_line")
[[ "$dd_bytes" =~ ^[0-9]+$ ]] || { echo "error: dd failed: $dd_line"; exit 1; }
echo "dd: $dd_line"

# Room for one checkpoint: 12 bytes per parameter (master, exp_avg, exp_avg_sq in fp32).
params=$("$bin" plan $model_args --zero_stage 3 2>/dev/null | grep -oE '[0-9]+ parameters' | head -n 1 | awk '{print $1}')
avail=$(df --output=avail -B1 "$dir" | tail -n 1)
if [[ "$params" =~ ^[0-9]+$ ]] && [ $((params * 12 * 105 / 100)) -gt "$avail" ]; then
  echo "error: $dir has $((avail >> 30)) GiB free; a checkpoint of $params parameters needs $((params * 12 >> 30)) GiB"
  exit 1
fi

python3 - <<'PY'
import json, random
random.seed(1)
with open("/tmp/ckpt_write_data.jsonl", "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(1500) for _ in range(4096)]}) + "\n")
PY

# (b) two steps, one checkpoint at the end (--save_steps 2).
log="$dir/run.log"
timeout 900 mpirun -np "$np" --bind-to none "$bin" --device "$device" $model_args \
  --dataset /tmp/ckpt_write_data.jsonl --max_length "$max_length" --truncation_strategy right \
  --per_device_train_batch_size 1 --max_steps 2 --logging_steps 1 --warmup_steps 0 --zero_stage 3 \
  --collective_timeout 600 --save_strategy steps --save_steps 2 --overwrite_output_dir true --output_dir "$dir/out" >"$log" 2>&1 ||
  { echo "glm_hpc failed:"; tail -n 15 "$log"; exit 1; }
grep -E "^step|saved" "$log"

# (c) the table.
python3 - "$dir/out/logging.jsonl" "$dd_bytes" "$dd_seconds" "$np" "$device" <<'PY'
import json, sys
path, dd_bytes, dd_seconds, np, device = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
saves = [json.loads(l) for l in open(path) if '"save_bytes"' in l]
if not saves:
    sys.exit("error: no save record in " + path)
s = saves[-1]
dd_rate = dd_bytes / dd_seconds / 1e9
rate = s["save_bytes"] / s["save_seconds"] / 1e9
print(f"\n== checkpoint write, {np} rank(s) on {device}, ZeRO-3 ==")
print(f"{'what':28s} {'GB':>9s} {'seconds':>9s} {'GB/s':>7s} {'of dd':>7s}")
print(f"{'dd bs=64M oflag=direct':28s} {dd_bytes / 1e9:9.2f} {dd_seconds:9.2f} {dd_rate:7.2f} {'100%':>7s}")
print(f"{'glm_hpc ' + s['checkpoint'].split('/')[-1]:28s} {s['save_bytes'] / 1e9:9.2f} {s['save_seconds']:9.2f} "
      f"{rate:7.2f} {100 * rate / dd_rate:6.1f}%")
PY
[ "${GLM_KEEP:-0}" = 1 ] || rm -rf "$dir/out"
