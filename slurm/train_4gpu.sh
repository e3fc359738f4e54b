#!/bin/bash
# glm_hpc on one node with 4 GPUs, one MPI rank per GPU. Submit from the repository root:
#   sbatch slurm/train_4gpu.sh                                  # configs/glm4-9b-chat.cfg, ZeRO-3
#   GLM_CONFIG=configs/glm4-tiny.cfg GLM_DATASET=chats.jsonl sbatch slurm/train_4gpu.sh --max_steps 100
#   sbatch --time=2:00:00 slurm/train_4gpu.sh --model_id_or_path /models/glm-4-9b-chat --learning_rate 1e-5
# The same command on a 4-GPU host without Slurm (what benchmarks/calls/node_x4_call1.sh runs):
#   GLM_NTASKS=4 GLM_BIN=build-gpu/glm_hpc GLM_OUTPUT_DIR=/tmp/run bash slurm/train_4gpu.sh --max_steps 30
# Arguments after the script go to glm_hpc; GLM_* environment knobs (config, dataset, output
# directory, device, launcher) are listed in slurm/glm_job.sh and the README's Slurm section.
# The run writes to output/slurm-<job id>/ and logs to slurm-<job name>-<job id>.out.
#
#SBATCH --job-name=glm_hpc
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%j.out
# A requeued job appends to the same log instead of truncating it.
#SBATCH --open-mode=append
# Five minutes before the time limit Slurm sends SIGUSR1 to this batch shell, which hands it to the
# ranks: they agree on a step, save a checkpoint, exit 75, and the job requeues itself; the
# requeued job (same id, same output directory) resumes from the latest checkpoint.
#SBATCH --signal=B:USR1@300
#SBATCH --requeue

set -euo pipefail
GLM_HOME="${GLM_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
if [[ ! -f "$GLM_HOME/slurm/glm_job.sh" ]]; then
  echo "glm_job: error: $GLM_HOME/slurm/glm_job.sh not found: submit from the glm_hpc repository root or set GLM_HOME" >&2
  exit 2
fi
export GLM_HOME
source "$GLM_HOME/slurm/glm_job.sh"
glm_job_run configs/glm4-9b-chat.cfg "--zero_stage 3" "$@"
