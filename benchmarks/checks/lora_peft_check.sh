#!/usr/bin/env bash
# glm_hpc LoRA against transformers + PEFT (issue 10). Builds nothing: give it a build directory
# holding glm_hpc and glm_dump_logits (e.g. GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc glm_dump_logits"
# bash benchmarks/calls/gpu_session.sh, then: bash benchmarks/checks/lora_peft_check.sh build-gpu). Needs python3
# with torch, transformers, peft and safetensors (no network). Steps, on the tiny default model:
#   1. a full run of 1 step, exported as the Hugging Face base (bf16: exactly what both sides load);
#   2. LoRA on that base (--model_id_or_path) for 4 steps on NP ranks at ZeRO-3 (CPU by default;
#      DEVICE=cuda NP=1 on one GPU, NP=2 on two), so that B is no longer zero;
#   3. export of the adapters (PEFT's format) and of base + adapters merged (--merge_lora true);
#   4. glm_dump_logits of the LoRA checkpoint for a fixed batch: logits, loss and adapter gradients;
#   5. benchmarks/peers/peft_check.py: PeftModel.from_pretrained on the base in fp32 against ours.
# Prints the export reports, a table and PASS/FAIL; logs go to $OUT.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
B=$(realpath "${1:?usage: bash benchmarks/checks/lora_peft_check.sh BUILD_DIR}")
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cpu}
NP=${NP:-2}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
for tool in glm_hpc glm_dump_logits; do
  [ -x "$B/$tool" ] || { echo "FAIL: $B/$tool is missing (build the glm_hpc and glm_dump_logits targets)"; exit 1; }
done
W=$(mktemp -d /tmp/glm_lora_peft_check.XXXXXX)
fail() { echo "FAIL: $1 (log: $2)"; tail -20 "$2"; rm -rf "$W"; exit 1; }

# 1. The base: a random model one step in, as a Hugging Face directory (with the sample tokenizer).
mpirun -np 1 "$B/glm_hpc" --device "$DEVICE" --max_steps 1 --save_steps 1 --initializer_range 0.1 \
  --dataset_cache false --output_dir "$W/full" >"$OUT/peft_base_train.log" 2>&1 || fail "base training" "$OUT/peft_base_train.log"
"$B/glm_hpc" export --ckpt_dir "$W/full" --save_dir "$W/base" >"$OUT/peft_base_export.log" 2>&1 ||
  fail "export of the base" "$OUT/peft_base_export.log"

# 2. LoRA on it (alpha / r = 2; a learning rate that moves B well away from zero in 4 steps).
mpirun -np "$NP" "$B/glm_hpc" --device "$DEVICE" --train_type lora --model_id_or_path "$W/base" --lora_rank 8 \
  --lora_alpha 16 --target_modules all-linear --zero_stage 3 --max_steps 4 --save_steps 4 --learning_rate 2e-2 \
  --logging_steps 1 --dataset_cache false --output_dir "$W/lora" >"$OUT/peft_lora_train.log" 2>&1 ||
  fail "LoRA training" "$OUT/peft_lora_train.log"

# 3. The adapters as PEFT saves them, and the merged model.
"$B/glm_hpc" export --ckpt_dir "$W/lora" --save_dir "$W/adapter" >"$OUT/peft_export.log" 2>&1 ||
  fail "export of the adapters" "$OUT/peft_export.log"
"$B/glm_hpc" export --ckpt_dir "$W/lora" --save_dir "$W/merged" --merge_lora true >>"$OUT/peft_export.log" 2>&1 ||
  fail "export --merge_lora true" "$OUT/peft_export.log"
cat "$OUT/peft_export.log"

# 4. A fixed batch: 2 rows of 48 ids below the model's vocab_size; ours for it.
python3 - "$W/base/config.json" "$W/ids.json" <<'PY'
import json, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
json.dump([[(97 * t + 13 * r + 7) % vocab for t in range(48)] for r in range(2)], open(sys.argv[2], "w"))
PY
"$B/glm_dump_logits" --ckpt_dir "$W/lora" --input_ids "$W/ids.json" --out "$W/ours.safetensors" \
  --grads_out "$W/grads.safetensors" >"$OUT/peft_dump.log" 2>&1 || fail "glm_dump_logits" "$OUT/peft_dump.log"
cat "$OUT/peft_dump.log"

# 5. PEFT.
python3 benchmarks/peers/peft_check.py --base "$W/base" --adapter "$W/adapter" --merged "$W/merged" \
  --input_ids "$W/ids.json" --ours "$W/ours.safetensors" --grads "$W/grads.safetensors" 2>"$OUT/peft_check.err"
rc=$?
[ $rc -ne 0 ] && tail -20 "$OUT/peft_check.err"
rm -rf "$W"
exit $rc
