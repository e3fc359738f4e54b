#!/usr/bin/env bash
# glm_hpc export against transformers. Builds nothing: give it a build directory holding glm_hpc
# and glm_dump_logits (e.g. GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc glm_dump_logits" bash
# benchmarks/calls/gpu_session.sh, then: bash benchmarks/checks/export_check.sh build-gpu). Needs python3 with
# torch, transformers and safetensors. Trains the tiny default 4 steps on 2 ranks at ZeRO-3 (CPU
# by default; DEVICE=cuda with 2 GPUs), exports both layouts in small shards, dumps our logits for
# a fixed batch and has benchmarks/peers/hf_export_check.py load the exports in transformers and
# compare (fp32). Prints the export reports, a table and PASS/FAIL; logs go to $OUT.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
B=$(realpath "${1:?usage: bash benchmarks/checks/export_check.sh BUILD_DIR}")
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cpu}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
for tool in glm_hpc glm_dump_logits; do
  [ -x "$B/$tool" ] || { echo "FAIL: $B/$tool is missing (build the glm_hpc and glm_dump_logits targets)"; exit 1; }
done
W=$(mktemp -d /tmp/glm_export_check.XXXXXX)
fail() { echo "FAIL: $1 (log: $2)"; tail -20 "$2"; exit 1; }

mpirun -np 2 "$B/glm_hpc" --device "$DEVICE" --max_steps 4 --save_steps 4 --zero_stage 3 --logging_steps 1 \
  --dataset_cache false --output_dir "$W/run" >"$OUT/export_train.log" 2>&1 || fail "training" "$OUT/export_train.log"
"$B/glm_hpc" export --ckpt_dir "$W/run" --save_dir "$W/hf" --max_shard_size 200KB >"$OUT/export_hf.log" 2>&1 ||
  fail "export --export_format hf" "$OUT/export_hf.log"
"$B/glm_hpc" export --ckpt_dir "$W/run" --save_dir "$W/chatglm" --export_format chatglm --max_shard_size 200KB \
  >"$OUT/export_chatglm.log" 2>&1 || fail "export --export_format chatglm" "$OUT/export_chatglm.log"
cat "$OUT/export_hf.log" "$OUT/export_chatglm.log"

# A fixed batch: 2 rows of 48 ids below the model's vocab_size.
python3 - "$W/hf/config.json" "$W/ids.json" <<'PY'
import json, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
json.dump([[(97 * t + 13 * r + 7) % vocab for t in range(48)] for r in range(2)], open(sys.argv[2], "w"))
PY
ckpt="$W/run/checkpoint-4"
"$B/glm_dump_logits" --ckpt_dir "$ckpt" --input_ids "$W/ids.json" --out "$W/ours.safetensors" >"$OUT/export_logits.log" 2>&1 &&
  "$B/glm_dump_logits" --ckpt_dir "$ckpt" --input_ids "$W/ids.json" --out "$W/ours_fp32.safetensors" \
    --bf16_weights false >>"$OUT/export_logits.log" 2>&1 || fail "glm_dump_logits" "$OUT/export_logits.log"
python3 benchmarks/peers/hf_export_check.py --hf_dir "$W/hf" --chatglm_dir "$W/chatglm" --input_ids "$W/ids.json" \
  --ours "$W/ours.safetensors" --ours_fp32 "$W/ours_fp32.safetensors" 2>"$OUT/export_check.err"
rc=$?
[ $rc -ne 0 ] && tail -20 "$OUT/export_check.err"
rm -rf "$W"
exit $rc
