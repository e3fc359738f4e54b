#!/usr/bin/env bash
# A rank SIGKILLed while checkpoint-4 is being written (GLM_TEST_KILL_DURING_SAVE=1:4, CPU, 2 ranks,
# tiny model): the job ends non-zero within the collective timeout with mpirun naming the signal,
# checkpoint-2 stays complete and `latest` names it, and --resume_from_checkpoint latest continues
# with the same losses and gradient norms, bit for bit, as a straight run.
# Usage: checkpoint_kill_test.sh GLM_HPC_BINARY MPIEXEC SOURCE_DIR
set -u
bin=$1 mpiexec=$2 source_dir=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/glm_ckpt_kill.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 XDG_CACHE_HOME="$scratch/cache"
cd "$source_dir" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

common=(--hidden_size 32 --intermediate_size 48 --head_dim 8 --max_length 512 --max_steps 6
        --per_device_train_batch_size 2 --logging_steps 1 --save_steps 2 --collective_timeout 30)
# A hang shows up as exit code 124 from timeout.
run() { timeout 120 "$mpiexec" --oversubscribe -np 2 "$bin" "${common[@]}" "$@" 2>&1; }
# "step loss grad_norm" of every training record of a logging.jsonl (full precision).
trajectory() {
  grep '"loss":' "$1" | sed -E 's/.*"grad_norm":([^,}]*).*"loss":([^,}]*).*"step":([0-9]+).*/\3 \2 \1/'
}

straight_out=$(run --output_dir "$scratch/straight") || { echo "$straight_out"; fail "the straight run failed"; exit 1; }

start=$(date +%s)
killed_out=$(GLM_TEST_KILL_DURING_SAVE=1:4 run --output_dir "$scratch/run")
rc=$?
seconds=$(($(date +%s) - start))
echo "$killed_out" | tail -n 15
[ "$rc" -ne 0 ] || fail "the killed run exited 0"
[ "$rc" -ne 124 ] || fail "the killed run hung until the 120 s timeout"
[ "$seconds" -lt 60 ] || fail "the killed run took ${seconds} s (collective timeout 30 s)"
grep -q "GLM_TEST_KILL_DURING_SAVE: SIGKILL while writing" <<<"$killed_out" || fail "rank 1 did not kill itself mid-save"
grep -q "signal 9" <<<"$killed_out" || fail "the launcher did not name the killed rank's signal"
grep -q "step 4/6" <<<"$killed_out" || fail "training did not reach step 4 before the save"
[ "$(cat "$scratch/run/latest" 2>/dev/null)" = "checkpoint-2" ] || fail "latest is '$(cat "$scratch/run/latest" 2>/dev/null)', not checkpoint-2"
[ -f "$scratch/run/checkpoint-2/COMPLETE" ] || fail "checkpoint-2 lost its COMPLETE marker"
[ ! -e "$scratch/run/checkpoint-4" ] || fail "the interrupted checkpoint-4 was published"

resumed_out=$(run --output_dir "$scratch/run" --resume_from_checkpoint latest)
rc=$?
[ "$rc" -eq 0 ] || { echo "$resumed_out"; fail "the resumed run exited $rc"; }
grep -q "resumed from .*checkpoint-2 at step 2" <<<"$resumed_out" || fail "the resume did not start from checkpoint-2"
[ -f "$scratch/run/checkpoint-4/COMPLETE" ] || fail "the resumed run did not write checkpoint-4"
leftovers=$(find "$scratch/run" -maxdepth 1 -name '.checkpoint-*.tmp-*')
[ -z "$leftovers" ] || fail "the interrupted save's temporary is still there: $leftovers"
# The resumed run's logging.jsonl keeps the killed run's steps 1-2 (up to the checkpoint), drops
# its steps 3-4 (redone) and appends 3-6: the whole history equals the straight run's, once each.
expected=$(trajectory "$scratch/straight/logging.jsonl")
actual=$(trajectory "$scratch/run/logging.jsonl")
[ -n "$expected" ] && [ "$(wc -l <<<"$expected")" -eq 6 ] || fail "the straight run did not log steps 1-6"
if [ "$expected" != "$actual" ]; then
  fail "the resumed run's log differs from the straight run's steps 1-6"
  diff <(echo "$expected") <(echo "$actual")
fi
[ "$failures" -eq 0 ] && echo "PASS: killed mid-save after ${seconds} s; resumed from checkpoint-2; its log holds the straight run's steps 1-6"
exit $((failures > 0))
