#!/usr/bin/env bash
# Installs what glm_hpc's build and tests need (Debian/Ubuntu packages, and the pinned npm tiktoken
# of the tokenizer tests), idempotently and quietly: nothing is fetched when everything is there.
# --build-only: what configuring and building needs, nothing that only the tests use (scripts/demo.sh).
set -euo pipefail
build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-dev libboost-program-options-dev nlohmann-json3-dev libpcre2-dev
  # TensorBoard event files: the schema is compiled by protoc at build time (src/io/tensorboard.h).
  libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev libbenchmark-dev
)
test_packages=(
  # A one-host Slurm for tests/slurm/run_slurm_test.sh (the test starts and stops the daemons).
  munge slurmctld slurmd slurm-client
  # benchmarks/calls/bucket_sweep.py draws its PNG with gnuplot (it writes the CSV without it).
  gnuplot-nox
  # The function-size check of the engine and ZeRO (tests/CMakeLists.txt, function_size).
  clang-tidy
  # The fuzz targets and sanitizer builds (scripts/fuzz.sh, scripts/sanitize.sh): clang, and the
  # compiler-rt archives (libFuzzer, ASan, UBSan), which clang only recommends.
  clang libclang-rt-dev
)

# node and npm run npm tiktoken, the oracle of the tokenizer tests (tools/tiktoken_peer). Checked
# by command, not package: a nodejs from elsewhere (NodeSource) bundles its own npm.
command -v node >/dev/null || test_packages+=(nodejs)
command -v npm >/dev/null || test_packages+=(npm)
[ "$build_only" = 1 ] || packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "$build_only" = 1 ] && exit 0
# The pinned npm tiktoken (package-lock.json) into the git-ignored tools/tiktoken_peer/node_modules;
# a copy of the lock file there marks an install that is current.
peer="$(cd "$(dirname "$0")/.." && pwd)/tools/tiktoken_peer"
if ! cmp -s "$peer/package-lock.json" "$peer/node_modules/.glm_installed_lock.json"; then
  echo "setup: npm ci in tools/tiktoken_peer"
  (cd "$peer" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$peer/package-lock.json" "$peer/node_modules/.glm_installed_lock.json"
fi
