#!/usr/bin/env bash
# On a machine with 2 GPUs: checkpoints on the CUDA backend. The tiny default trains 20 steps on
# 2 GPUs at ZeRO-3 saving at step 10; resuming from it on 2 GPUs and on 1 GPU (same global batch)
# must continue with the same losses (bf16 tolerance). Also runs the NCCL ctests.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$(dirname "$0")/../.."
GLM_ONLY_BUILD=1 bash benchmarks/calls/gpu_session.sh | tail -1
B=build-gpu/glm_hpc
common="--device cuda --max_steps 20 --logging_steps 1 --dataset_cache false"
mpirun -np 2 $B $common --zero_stage 3 --save_steps 10 --overwrite_output_dir true --output_dir /tmp/g2 > $OUT/g2.log 2>&1; echo "2gpu straight rc=$?"
mpirun -np 2 $B $common --zero_stage 3 --save_strategy no --output_dir /tmp/g2r --resume_from_checkpoint /tmp/g2/checkpoint-10 > $OUT/g2r.log 2>&1; echo "2gpu resume rc=$?"
mpirun -np 1 $B $common --gradient_accumulation_steps 2 --save_strategy no --output_dir /tmp/g1r --resume_from_checkpoint /tmp/g2/checkpoint-10 > $OUT/g1r.log 2>&1; echo "1gpu resume rc=$?"
for f in g2 g2r g1r; do echo "$f: $(grep -E '^step (11|15|20)/' $OUT/$f.log | sed 's/ | lr.*//' | tr '\n' ' ')"; done
grep -iE "error|fatal" $OUT/*.log | head -5
(cd build-gpu && timeout 100 ctest -R "bench_comm_Nccl|test_nccl" --output-on-failure > $OUT/ct.log 2>&1; echo "nccl ctests rc=$?"; grep -E "tests passed|Failed|Skipped" $OUT/ct.log | head -5)
