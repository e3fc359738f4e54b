#!/usr/bin/env bash
# Issue 11, call 1 of 2, on nvidia-h200-x4 (4 x H200), from the device tool:
#   run(kind="nvidia-h200-x4", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x4_call1.sh")
# Expected: ~470 s on a bare machine (build ~240 s: an estimate, RESULTS.md records no build time;
# each 30-step GLM-4-9B run ~30 s: ~15 s start, 0.53 s a step on 2 x H200), ~230 s when warm.
# In order of importance (a deadline cut, if the build runs long, takes the last first):
#  1. slurm/train_4gpu.sh's own command (GLM_NTASKS=4, no Slurm here: mpirun -np 4): GLM-4-9B-Chat
#     shapes, random init, seq 4096, micro-batch 1 per GPU, ZeRO-1, 2 and 3, 30 steps each
#  2. the tiny model's checkpoint saved on 4 GPUs (ckpt_x4.tar.gz comes back), resumed on 2 of them
#  3. mpirun -np 4 build-gpu/tests/test_nccl (collectives and ZeRO 0-3 against MPI at world size 4)
#  4. the runs of 1 on GPUs 0-1 through benchmarks/calls/zero_x2.sh: the 2-GPU numbers of RESULTS.md
#     measured again on this machine, for the scaling efficiency (target >= 95% per GPU)
# Every step has its own limit and the call a deadline (benchmarks/calls/node_lib.sh); the tables come
# last. Back in $OUT: summary_x4_1.txt, logs_x4_1.tar.gz, zero_results_x4_1.jsonl, ckpt_x4.tar.gz.
# Next: node_x4_call2.sh at once (the machine stays warm 30 s; a bare one builds again).
export NODE_CALL=x4_1
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
for stage in 1 2 3; do node_zero "zero${stage}_4gpu_slurm" 4 4096 "$stage" slurm/train_4gpu.sh; done
node_checkpoint 4
node_test_nccl 4
for stage in 1 2 3; do node_zero "zero${stage}_2gpu" 2 4096 "$stage"; done
node_plan_one_gpu
node_finish 0.95
