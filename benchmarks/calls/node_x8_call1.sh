#!/usr/bin/env bash
# Issue 12, call 1 of 4, on nvidia-h200-x8 (8 x H200), from the device tool:
#   run(kind="nvidia-h200-x8", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x8_call1.sh")
# Expected: ~420 s on a bare machine (build ~240 s, an estimate), ~180 s warm.
#  1. mpirun -np 8 build-gpu/tests/test_nccl (collectives and ZeRO 0-3 against MPI at world size 8)
#  2. the tiny model's checkpoint saved on 8 GPUs (ckpt_x8.tar.gz comes back), resumed on 2 of them
#  3. bench_comm on the 8 GPUs (bf16 and f32, 1 KiB to 4 GiB; public figure for 8 H100s without
#     NVLink SHARP: ~360-370 GB/s ring busbw) with PyTorch's NCCL calls in the same call
# Back in $OUT: summary_x8_1.txt, logs_x8_1.tar.gz, ckpt_x8.tar.gz. Next: node_x8_call2.sh at once.
export NODE_CALL=x8_1
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
node_test_nccl 8
node_checkpoint 8
node_comm
node_plan_one_gpu
node_finish 0.9
