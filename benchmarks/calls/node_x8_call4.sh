#!/usr/bin/env bash
# Issue 12, call 4 of 4, on nvidia-h200-x8 (8 x H200), right after node_x8_call3.sh:
#   run(kind="nvidia-h200-x8", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x8_call4.sh")
# Expected: ~330 s warm, ~560 s on a bare machine (then the deadline cuts the last 4-GPU run).
#  1. the trainer bucket sweep on 8 GPUs at ZeRO-2, then ZeRO-3 (16M, 256M, 1G x overlap on/off,
#     5 steps each, then --reduce_bucket_size auto): one PNG per stage
#  2. the call-2 runs on GPUs 0-3 (seq 4096, ZeRO-1, 2, 3, 30 steps): the 4-GPU column of the
#     scaling table, which this call prints over every row of the machine's calls
# Back in $OUT: summary_x8_4.txt, logs_x8_4.tar.gz, sweep_z2_x8.png, sweep_z3_x8.png,
# zero_results_x8_4.jsonl. On the dev box, python3 benchmarks/calls/zero_scaling.py --target 0.9 over the
# zero_results files of calls 2-4 (and issue 11's) prints the scaling table 2 / 4 / 8 again.
export NODE_CALL=x8_4
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
node_sweep 2
node_sweep 3
for stage in 1 2 3; do node_zero "zero${stage}_4gpu" 4 4096 "$stage"; done
node_finish 0.9
