#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test: unit, mpi, and gpu (skipped without a GPU);
# then, unless ctest arguments narrow the run, each fuzz target briefly (docs/FUZZING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The kernels for sm_80 (what every Ampere, Ada and later GPU runs) and sm_90a (Hopper's wgmma code):
# both kinds of code compile in half the time of the default fat build.
bash scripts/build.sh -DGLM_WERROR=ON "-DCMAKE_CUDA_ARCHITECTURES=80-real;90a-real"
source scripts/mpi_env.sh
(cd build && ctest --output-on-failure --parallel 2 "$@")
if [ $# -eq 0 ]; then
  bash scripts/fuzz.sh --quick 6
fi
