#!/usr/bin/env bash
# The trainer bucket sweep on the GPUs of one host with GLM-4-9B-Chat's real shapes (random init,
# seq 4096, micro-batch 1 per GPU, one rank per GPU over NCCL), then --reduce_bucket_size auto at
# each stage for comparison with the sweep's best. Needs build-gpu/ (gpu_session.sh). Writes
# $OUT/sweep/bucket_sweep.{csv,png} and the runs' logs. GLM_SWEEP_STAGES, GLM_SWEEP_BYTES,
# GLM_SWEEP_STEPS and GLM_SWEEP_OVERLAP override the defaults.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
gpus=$(nvidia-smi -L | wc -l)
steps=${GLM_SWEEP_STEPS:-5}
stages=${GLM_SWEEP_STAGES:-1,2,3}
test -s /tmp/bench9b.jsonl || python3 - <<'PY'
import json, random
random.seed(1)
with open("/tmp/bench9b.jsonl", "w") as f:
    for _ in range(64):
        f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
model=(--config configs/glm4-9b-chat.cfg --dataset /tmp/bench9b.jsonl --max_length 4096
       --per_device_train_batch_size 1 --gradient_accumulation_steps 1 --collective_timeout 120)
python3 benchmarks/calls/bucket_sweep.py --binary build-gpu/glm_hpc --np "$gpus" --device cuda \
  --bucket_bytes "${GLM_SWEEP_BYTES:-4M,16M,64M,256M,1G}" --stages "$stages" --overlap "${GLM_SWEEP_OVERLAP:-true,false}" \
  --steps "$steps" --skip_steps 2 --timeout 400 --out "$OUT/sweep" -- "${model[@]}"
# auto at each stage: what it picked (and why) and its step time, to hold against the sweep's best.
for stage in ${stages//,/ }; do
  dir=/tmp/sweep_auto_$stage
  timeout 400 mpirun -np "$gpus" --bind-to none build-gpu/glm_hpc --device cuda "${model[@]}" --max_steps "$steps" \
    --logging_steps 1 --warmup_steps 0 --save_strategy no --zero_stage "$stage" --reduce_bucket_size auto \
    --overwrite_output_dir true --output_dir "$dir" >"$OUT/sweep/auto_$stage.log" 2>&1 || { echo "auto at ZeRO-$stage failed"; tail -5 "$OUT/sweep/auto_$stage.log"; }
  grep -- "--reduce_bucket_size auto" "$OUT/sweep/auto_$stage.log" | head -1
  python3 - "$dir/logging.jsonl" "$stage" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l][2:]
if recs:
    s = sum(r["step_seconds"] for r in recs) / len(recs)
    e = sum(r["exposed_comm_seconds"] for r in recs) / len(recs)
    print(f"auto at ZeRO-{sys.argv[2]}: step {s:.4f} s, exposed comm {100 * e / s:.2f}%")
PY
done
