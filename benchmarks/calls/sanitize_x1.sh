#!/usr/bin/env bash
# One device call: the unit and mpi tests built with GCC's AddressSanitizer and UBSan, on the lent
# machine's cores (scripts/sanitize.sh is the same with clang, for a machine that has it; the lent
# machine has GCC only). Carries .deb, and build-cpu/Testing/Temporary/CTestCostData.txt where there is one. Prints the build time and ctest's summary last.
# The whole suite instrumented outlasts one call's 10 minutes: GLM_SANITIZE_PART=K/N runs every N-th
# entry from the K-th (ctest -I K,,N); a later call on the still-warm machine reuses the build.
# The default training job (CliTokenizer.DefaultRunUsesTheSampleTokenizerAndLearns, 75 steps of 8 s
# instrumented) is left out: the shorter runs cover its code.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source benchmarks/calls/device_env.sh
# Every instrumented process reads these: gtest's discovery during the build, the tests, mpirun's ranks.
# fast_unwind_on_malloc=0: allocation stacks from the slow unwinder, whole through Open MPI's
# libraries (built without frame pointers); the fast one stops in the plugin's first frame, which no
# suppression can name once the plugin is unloaded.
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0 UBSAN_OPTIONS=print_stacktrace=1
# Open MPI unloads its plugins at exit, and LeakSanitizer then cannot name them; kept loaded, their
# allocations match the suppressions (mca_*).
export OMPI_MCA_mca_base_component_disable_dlclose=1
# Entries reserve a ctest slot per rank (GLM_MPI_TEST_PROCESSORS): at most 16 ranks run on the 16
# cores at once. Ranks still yield while they wait, beside the single-process entries.
export OMPI_MCA_mpi_yield_when_idle=1
t0=$(date +%s)
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O1 -DGLM_CUDA=OFF \
  -DGLM_SANITIZE=address,undefined -DGLM_TEST_TIMEOUT_SCALE=6 -DGLM_MPI_TEST_PROCESSORS=ON -DGLM_BUILD_BENCHMARKS=OFF "${boost_args[@]}" >"$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-sanitize -j "$(nproc)" -- -k 0 >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
source scripts/mpi_env.sh
part=()
if [ -n "${GLM_SANITIZE_PART:-}" ]; then part=(-I "${GLM_SANITIZE_PART%/*},,${GLM_SANITIZE_PART#*/}"); fi
# Longest entries first: ctest orders by the costs of an earlier run, here the carried CPU build's.
cost=build-cpu/Testing/Temporary/CTestCostData.txt
if [ -f "$cost" ]; then mkdir -p build-sanitize/Testing/Temporary && cp "$cost" build-sanitize/Testing/Temporary/; fi
left=$(( 570 - ($(date +%s) - t0) ))
(cd build-sanitize && timeout "$left" ctest -L 'unit|mpi' -E 'TiktokenPeer|DefaultRunUsesTheSampleTokenizer' \
  "${part[@]}" -j "$(nproc)" --timeout 480 --output-on-failure >"$OUT/ctest.log" 2>&1; echo "ctest rc=$?")
grep -E "ERROR: AddressSanitizer|runtime error|LeakSanitizer" "$OUT/ctest.log" | sort | uniq -c | head -20
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Total Test time" "$OUT/ctest.log" | head -30
