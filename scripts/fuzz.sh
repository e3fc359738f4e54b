#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (one per parser of user files) into build-fuzz with
# clang, ASan and UBSan, and runs each for SECONDS (default 60) on its seed corpus, two at a time.
# Fails on any crash, hang (5 s per input), allocation past 2 GiB or sanitizer report, and names the
# reproducer it saved under build-fuzz/fuzz/<target>/. docs/FUZZING.md says more.
#   scripts/fuzz.sh [--quick] [SECONDS] [TARGET_REGEX]     e.g. scripts/fuzz.sh 600 jsonl
# --quick (CI) builds at -O0: half the build time, fewer inputs per second.
set -euo pipefail
cd "$(dirname "$0")/.."
opt=-O1
if [ "${1:-}" = "--quick" ]; then
  opt=-O0
  shift
fi
seconds=${1:-60}
pattern=${2:-}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# A Debug build keeps assertions on (nlohmann-json's among them), turning silent misuse into findings.
# A unity build (each library's sources compiled a batch at a time) nearly halves the build on 2 cores.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="$opt" -DCMAKE_C_FLAGS_DEBUG="$opt" -DGLM_CUDA=OFF \
  -DGLM_FUZZ=ON -DGLM_BUILD_TESTS=OFF -DGLM_BUILD_BENCHMARKS=OFF -DGLM_FUZZ_SECONDS="$seconds" -DCMAKE_UNITY_BUILD=ON \
  "${launcher[@]}" >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target fuzz_targets
cd build-fuzz
ctest -L fuzz --output-on-failure --parallel "$(nproc)" ${pattern:+-R "$pattern"}
