#!/usr/bin/env bash
# Configures and builds glm_hpc into build/ (Release): every target, or those named by leading
# --target NAME arguments. Further arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while [ "${1:-}" = "--target" ]; do
  targets+=(--target "${2:?--target needs a name}")
  shift 2
done
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build --parallel "$(nproc)" "${targets[@]}"
