#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test: unit, mpi, and gpu (skipped without a GPU);
# then, unless ctest arguments narrow the run, each fuzz target briefly (docs/FUZZING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DGLM_WERROR=ON
source scripts/mpi_env.sh
(cd build && ctest --output-on-failure --parallel 2 "$@")
if [ $# -eq 0 ]; then
  bash scripts/fuzz.sh --quick 6
fi
