#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default: the tiny GLM-4 on the bundled
# sample conversations, 2 MPI ranks (CPU backend when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --build-only
bash scripts/build.sh --target glm_hpc
source scripts/mpi_env.sh
mpirun -np 2 build/glm_hpc "$@"
