#!/usr/bin/env bash
# Issue 12, call 3 of 4, on nvidia-h200-x8 (8 x H200), right after node_x8_call2.sh:
#   run(kind="nvidia-h200-x8", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x8_call3.sh")
# Expected: ~340 s warm, ~570 s on a bare machine (then the deadline may cut the peer short).
#  1. the call-2 runs at seq 8192 on the 8 GPUs: ZeRO-1, 2 and 3, 30 steps each (each fits: the
#     planner predicts 102 / 86 / 72 GiB per GPU)
#  2. the FSDP2 peer at seq 8192 on the 8 GPUs, eager and with activation checkpointing, same call
#     (torchtitan's Llama-3.1-8B on 8 x H100, seq 8192: 5,762 / 6,667 tok/s/GPU, for orientation)
# Back in $OUT: summary_x8_3.txt, logs_x8_3.tar.gz, zero_results_x8_3.jsonl. Next: node_x8_call4.sh.
export NODE_CALL=x8_3
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
for stage in 1 2 3; do node_zero "zero${stage}_8gpu_s8192" 8 8192 "$stage"; done
node_peer fsdp2_8gpu_s8192 8 8192 eager,ckpt
node_finish 0.9
