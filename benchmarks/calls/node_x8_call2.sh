#!/usr/bin/env bash
# Issue 12, call 2 of 4, on nvidia-h200-x8 (8 x H200), right after node_x8_call1.sh:
#   run(kind="nvidia-h200-x8", carry=[".deb"], timeout_s=600, command="bash benchmarks/calls/node_x8_call2.sh")
# Expected: ~300 s warm, ~530 s on a bare machine.
#  1. mpirun -np 8 glm_hpc --config configs/glm4-9b-chat.cfg: full fine-tuning, random init, seq
#     4096, micro-batch 1 per GPU, ZeRO-1, 2 and 3, 30 steps each (benchmarks/calls/zero_x2.sh)
#  2. the PyTorch FSDP2 peer (benchmarks/peers/hf_glm_fsdp_peer.py, eager) on the 8 GPUs, same call
#  3. the same three runs on GPUs 0-1: the 2-GPU column of the scaling table (target >= 90% per GPU)
# Back in $OUT: summary_x8_2.txt, logs_x8_2.tar.gz, zero_results_x8_2.jsonl. Next: node_x8_call3.sh.
export NODE_CALL=x8_2
# shellcheck source=benchmarks/calls/node_lib.sh
source "$(dirname "$0")/node_lib.sh"
node_build glm_hpc test_nccl bench_comm
for stage in 1 2 3; do node_zero "zero${stage}_8gpu" 8 4096 "$stage"; done
node_peer fsdp2_8gpu 8 4096 eager
for stage in 1 2 3; do node_zero "zero${stage}_2gpu" 2 4096 "$stage"; done
node_finish 0.9
