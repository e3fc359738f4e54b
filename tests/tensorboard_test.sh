#!/usr/bin/env bash
# ctest tensorboard_events: a tiny run's TensorBoard event file read back by tensorboard_check.py
# (protoc --decode of every record, CRCs checked, every scalar and step equal to logging.jsonl),
# then a resume from the step-2 checkpoint over steps 3-6 whose file keeps one value per step.
# Usage: tensorboard_test.sh GLM_HPC_BINARY
set -euo pipefail
binary=$1
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/glm_tensorboard.XXXXXX")
trap 'rm -rf "$out"' EXIT
common=(--max_length 128 --logging_steps 1 --save_steps 2 --split_dataset_ratio 0.05 --report_to tensorboard
  --output_dir "$out/run")
"$binary" --max_steps 4 "${common[@]}" >"$out/first.log"
python3 "$here/tests/tensorboard_check.py" "$out/run" "$here/src/io/tensorboard_event.proto"
"$binary" --max_steps 6 --resume_from_checkpoint "$out/run/checkpoint-2" "${common[@]}" >"$out/second.log"
python3 "$here/tests/tensorboard_check.py" "$out/run" "$here/src/io/tensorboard_event.proto"
grep -q '"step": *6' "$out/run/logging.jsonl" || grep -q '"step":6' "$out/run/logging.jsonl"
