#!/usr/bin/env bash
# Issue 11, call 2 of 2, on nvidia-h200-x4 (4 x H200), right after node_x4_call1.sh:
#   run(kind="nvidia-h200-x4", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x4_call2.sh")
# Expected: ~310 s warm (build a no-op), ~540 s on a bare machine.
#  1. bench_comm on the 4 GPUs (bf16 and f32, 1 KiB to 4 GiB) with PyTorch's NCCL calls at 1 GiB in
#     the same call (benchmarks/calls/comm_x2.sh)
#  2. the trainer bucket sweep on 4 GPUs at ZeRO-2, then ZeRO-3 (16M, 256M, 1G buckets x overlap
#     on/off, 5 steps each, then --reduce_bucket_size auto; benchmarks/calls/bucket_sweep_gpu.sh): one PNG
#     per stage (matplotlib: the GPU image has no gnuplot)
# Back in $OUT: summary_x4_2.txt, logs_x4_2.tar.gz (bench_comm JSON, sweep CSVs), sweep_z2_x4.png,
# sweep_z3_x4.png, zero_results_x4_2.jsonl (call 1's rows too while the machine stayed warm; on
# the dev box, python3 benchmarks/calls/zero_scaling.py over both calls' files gives the scaling table).
# Later, on any 2-GPU call: the resume of ckpt_x4.tar.gz printed at the end of call 1.
export NODE_CALL=x4_2
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
node_comm
node_sweep 2
node_sweep 3
node_finish 0.95
