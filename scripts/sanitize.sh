#!/usr/bin/env bash
# Builds glm_hpc and its tests into build-sanitize with clang, AddressSanitizer and UBSan (a report
# ends the program), and runs the unit and mpi tests there. Too slow for CI (everything is built a
# second time, instrumented); run it before a release or after touching memory-heavy code.
#   scripts/sanitize.sh [ctest arguments]      e.g. scripts/sanitize.sh -R Tokenizer
# Leak reports ignore Open MPI's own allocations (tests/sanitize/lsan.supp); docs/FUZZING.md says why.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/setup.sh
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-sanitize -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O1 -DCMAKE_C_FLAGS_DEBUG=-O1 -DGLM_CUDA=OFF \
  -DGLM_SANITIZE=address,undefined -DGLM_TEST_TIMEOUT_SCALE=6 -DGLM_MPI_TEST_PROCESSORS=ON "${launcher[@]}" >/dev/null
# The options reach every instrumented process: gtest's test discovery during the build, the tests,
# and the ranks mpirun starts (it passes the environment on).
# fast_unwind_on_malloc=0: allocation stacks from the slow unwinder, whole through Open MPI's
# libraries (built without frame pointers); the fast one stops in the plugin's first frame, which no
# suppression can name once the plugin is unloaded.
export LSAN_OPTIONS=suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=print_stacktrace=1
# Open MPI unloads its plugins at exit, and LeakSanitizer then cannot name them; kept loaded, their
# allocations match the suppressions (mca_*).
export OMPI_MCA_mca_base_component_disable_dlclose=1
# An MPI entry reserves one ctest slot per rank (GLM_MPI_TEST_PROCESSORS), and waiting ranks yield:
# instrumented ranks spinning on fewer cores than they are slow down by hundreds of times.
export OMPI_MCA_mpi_yield_when_idle=1
cmake --build build-sanitize --parallel "$(nproc)"
source scripts/mpi_env.sh
# Longest entries first, by the costs of the CPU build's last run where there is one.
if [ -f build-cpu/Testing/Temporary/CTestCostData.txt ]; then
  mkdir -p build-sanitize/Testing/Temporary
  cp build-cpu/Testing/Temporary/CTestCostData.txt build-sanitize/Testing/Temporary/
fi
cd build-sanitize
ctest -L 'unit|mpi' --output-on-failure --parallel "$(nproc)" "$@"
