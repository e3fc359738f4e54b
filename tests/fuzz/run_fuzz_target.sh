#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time: its seed corpus first (every seed, so fixed crashes
# stay fixed), then mutations. Usage: run_fuzz_target.sh BINARY SEED_DIR WORK_DIR SECONDS [DICT...]
# (the dictionaries' tokens, file format keys and edge values, are offered to the mutations).
# New inputs go to WORK_DIR/corpus, a crash, leak or timeout to WORK_DIR/crash-*, leak-*, timeout-*
# (the exit status is then non-zero and the reproducer named).
set -uo pipefail
binary=$1 seeds=$2 work=$3 seconds=$4
shift 4
name=$(basename "$binary")
rm -rf "$work/tmp"
mkdir -p "$work/corpus" "$work/tmp"
dict=()
if [ $# -gt 0 ]; then
  cat "$@" >"$work/dict"
  dict=(-dict="$work/dict")
fi
touch "$work/started"
# Scratch files of the target (tests/fuzz/fuzz_util.h) stay in the build directory.
export TMPDIR="$work/tmp"
export UBSAN_OPTIONS=print_stacktrace=1
# -timeout: an input taking 5 s is a hang; -rss_limit_mb (and the malloc limit it implies) makes an
# allocation sized by the input past 2 GiB a finding, as the bad_alloc it would be for a user.
"$binary" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
  -artifact_prefix="$work/" "$work/corpus" "$seeds" >"$work/log.txt" 2>&1
status=$?
rm -rf "$work/tmp"
tail -n 20 "$work/log.txt"
if [ $status -ne 0 ]; then
  # The reproducers of this run, also as base64 so that a CI log alone is enough to get them back.
  for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    if [ -e "$f" ] && [ "$f" -nt "$work/started" ]; then
      echo "$name: reproducer $f (run: $binary $f)"
      if [ "$(stat -c %s "$f")" -le 16384 ]; then base64 -w 100 "$f"; fi
    fi
  done
  echo "$name: FAILED (exit $status); full log $work/log.txt"
  exit 1
fi
echo "$name: no crash in ${seconds} s"
