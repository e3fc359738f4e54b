#!/bin/bash
# glm_hpc on N nodes x 8 GPUs, one MPI rank per GPU (NCCL between GPUs, MPI for scalars and start-up).
# Submit from the repository root; --nodes on the command line overrides the default of 2:
#   sbatch --nodes=4 slurm/train_multinode.sh --zero_stage 3 --dataset /data/chats.jsonl
#   NCCL_SOCKET_IFNAME=ib0 NCCL_IB_HCA=mlx5 sbatch slurm/train_multinode.sh
# Arguments after the script go to glm_hpc; GLM_* environment knobs are listed in
# slurm/glm_job.sh and the README's Slurm section. Output: output/slurm-<job id>/.
#
#SBATCH --job-name=glm_hpc_multinode
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --output=slurm-%x-%j.out
#SBATCH --open-mode=append
# Ten minutes before the limit: checkpoint (a 9B ZeRO-3 save on a parallel file system takes a
# while), exit 75, requeue, resume from latest. See slurm/glm_job.sh.
#SBATCH --signal=B:USR1@600
#SBATCH --requeue

set -euo pipefail

# Cluster network knobs: set them here or in the submitting shell (sbatch exports it; the launch
# passes every NCCL_* and UCX_* variable to all ranks). Ask your site which values apply.
#   NCCL_SOCKET_IFNAME=ib0          interface for NCCL's bootstrap and socket transport
#                                   (ib0, eth0, or an exclusion list such as ^lo,docker)
#   NCCL_IB_HCA=mlx5_0,mlx5_1       InfiniBand/RoCE adapters NCCL may use (a prefix like mlx5
#                                   takes all; ^mlx5_2 excludes); NCCL_IB_DISABLE=1 forces TCP
#   NCCL_IB_GID_INDEX=3             RoCE only: the GID index of the RoCEv2 address
#   NCCL_NET_GDR_LEVEL=PHB          how far apart GPU and NIC may be for GPUDirect RDMA
#   NCCL_DEBUG=INFO                 (WARN by default) prints the transports and rings chosen at
#   NCCL_DEBUG_SUBSYS=INIT,NET      start: the first thing to read when multi-node NCCL is slow
#   UCX_NET_DEVICES=mlx5_0:1        Open MPI's UCX layer (MPI traffic): adapter:port to use
#   UCX_TLS=rc,sm,self              UCX transports
#   OMPI_MCA_pml=ucx                Open MPI over UCX (OMPI_MCA_btl=^openib silences the old verbs
#                                   transport's warnings on InfiniBand nodes)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

GLM_HOME="${GLM_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
if [[ ! -f "$GLM_HOME/slurm/glm_job.sh" ]]; then
  echo "glm_job: error: $GLM_HOME/slurm/glm_job.sh not found: submit from the glm_hpc repository root or set GLM_HOME" >&2
  exit 2
fi
export GLM_HOME
source "$GLM_HOME/slurm/glm_job.sh"
glm_job_run configs/glm4-9b-chat.cfg "--zero_stage 3" "$@"
