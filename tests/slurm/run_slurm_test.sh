#!/usr/bin/env bash
# slurm/train_4gpu.sh under a real Slurm on this one host (Debian's munge, slurmctld, slurmd, which
# scripts/setup.sh installs; nothing is installed here), started by scripts/local_slurm.sh as a
# user would, with its state, key and socket under a temporary directory, then:
#   1. sbatch slurm/train_4gpu.sh with the CPU backend and the tiny config, 4 ranks on one node
#      launched by mpirun: the job COMPLETED, 4 ranks ran, the loss fell, checkpoints exist;
#   2. a second job, launched by srun (PMIx), gets the pre-timeout signal as Slurm delivers it for
#      --signal=B:USR1@N (to the batch shell: scancel --signal=USR1 --batch): every rank saves the
#      same step and exits 75, the script requeues the job, and the requeued job resumes from
#      latest and runs the remaining steps, none twice, to COMPLETED.
# Every daemon started here is stopped on exit, failed or not. Usage: run_slurm_test.sh GLM_HPC_BINARY
# (ctest: label slurm). KEEP=1 keeps the temporary directory (logs) for inspection.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:?usage: run_slurm_test.sh GLM_HPC_BINARY}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

fail() {
  echo "slurm test: FAIL: $*" >&2
  exit 1
}
say() { echo "slurm test: $*"; }

[[ -x "$bin" ]] || fail "$bin is not an executable"
if [[ "$(id -u)" -ne 0 ]]; then
  # slurmd must run as root to start jobs; CI and the dev machines are root.
  echo "slurm test: SKIPPED: slurmd needs root (SlurmdUser=root); run as root"
  exit 77
fi
for cmd in munged munge slurmctld slurmd sbatch scontrol squeue scancel sinfo mpirun; do
  command -v "$cmd" >/dev/null || fail "'$cmd' not found: run scripts/setup.sh (it installs munge slurmctld slurmd slurm-client openmpi-bin)"
done

tmp="$(mktemp -d /tmp/glm_slurm_test.XXXXXX)"
export GLM_SLURM_DIR="$tmp/slurm"
cleanup() {
  local rc=$?
  set +e
  # The jobs, then the daemons (scripts/local_slurm.sh); the directory stays for the logs.
  bash "$repo/scripts/local_slurm.sh" down --keep >/dev/null
  if ((rc != 0)); then
    echo "slurm test: logs in $tmp (kept):" >&2
    for f in "$tmp"/job-*.out "$GLM_SLURM_DIR"/log/*.log; do
      [[ -f "$f" ]] || continue
      echo "----- $f (last 40 lines)" >&2
      tail -n 40 "$f" >&2
    done
  elif [[ "${KEEP:-0}" == "1" ]]; then
    echo "slurm test: kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$tmp"/{out,cache}
chmod 755 "$tmp"
# One node with the resources train_4gpu.sh asks for (4 tasks x 16 CPUs, 4 GPUs), as a user starts
# it: the script runs unchanged, and glm_hpc its CPU backend.
bash "$repo/scripts/local_slurm.sh" up --gpus 4 --cpus 64 || fail "scripts/local_slurm.sh up failed"
# shellcheck source=/dev/null
source "$GLM_SLURM_DIR/env"

# What sbatch exports to the jobs: run as root and oversubscribe (Open MPI), CPU backend, tiny model.
# shellcheck source=scripts/mpi_env.sh
source "$repo/scripts/mpi_env.sh"
export GLM_BIN="$bin" GLM_CONFIG=configs/glm4-tiny.cfg GLM_DEVICE=cpu GLM_OUTPUT_ROOT="$tmp/out"
export XDG_CACHE_HOME="$tmp/cache"

job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2-; }

# Waits until job $1 is in one of the states $2 (a regex); fails after $3 seconds.
wait_for_state() {
  local job="$1" states="$2" limit="$3" state=""
  local deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    state="$(job_field "$job" JobState)"
    if [[ "$state" =~ ^($states)$ ]]; then
      echo "$state"
      return 0
    fi
    sleep 1
  done
  fail "job $job still '$state' after ${limit}s (waiting for $states)"
}

loss_of_line() { grep -o '"loss":[0-9.eE+-]*' <<<"$1" | cut -d: -f2; }

cd "$repo"

# ---- 1. A job runs to completion.
job1="$(sbatch --parsable --output="$tmp/job-%j.out" slurm/train_4gpu.sh --max_steps 8 --save_steps 4 --logging_steps 1 \
  --per_device_train_batch_size 2)"
say "job $job1 submitted: slurm/train_4gpu.sh, 4 CPU ranks, 8 steps"
state="$(wait_for_state "$job1" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE' 150)"
log1="$tmp/job-$job1.out"
[[ "$state" == COMPLETED ]] || fail "job $job1 ended $state, exit $(job_field "$job1" ExitCode)"
[[ "$(job_field "$job1" ExitCode)" == "0:0" ]] || fail "job $job1 exit code $(job_field "$job1" ExitCode)"
# Rank 0's memory line gathers every rank's bytes: all 4 took part.
grep -q "^glm_hpc: memory per rank (ZeRO-[0-3]), ranks 0-3 of 4: " "$log1" || fail "4 ranks did not report in $log1"
grep -q "world size 4" "$log1" || fail "glm_hpc did not run with world size 4"
grep -q "^glm_job: mpirun -np 4 " "$log1" || fail "job $job1 did not launch with mpirun -np 4"
out1="$tmp/out/slurm-$job1"
steps="$(grep '"loss":' "$out1/logging.jsonl" || true)"
[[ "$(wc -l <<<"$steps")" -eq 8 ]] || fail "$out1/logging.jsonl should hold 8 step records"
first="$(loss_of_line "$(head -n 1 <<<"$steps")")"
last="$(loss_of_line "$(tail -n 1 <<<"$steps")")"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: step 1 $first, step 8 $last"
for step in 4 8; do
  [[ -f "$out1/checkpoint-$step/COMPLETE" ]] || fail "no complete checkpoint $out1/checkpoint-$step"
done
[[ "$(cat "$out1/latest")" == checkpoint-8 ]] || fail "$out1/latest is '$(cat "$out1/latest")', not checkpoint-8"
say "job $job1 COMPLETED: 4 ranks, loss $first -> $last, checkpoint-4 and checkpoint-8"

# ---- 2. The pre-timeout signal: checkpoint, requeue, resume.
total=16
# This job launches with srun (PMIx) instead of mpirun, so that both launchers run under Slurm.
job2="$(sbatch --parsable --output="$tmp/job-%j.out" --export=ALL,GLM_LAUNCHER=srun slurm/train_4gpu.sh --max_steps $total --save_steps 100 --logging_steps 1 \
  --per_device_train_batch_size 2)"
log2="$tmp/job-$job2.out"
out2="$tmp/out/slurm-$job2"
say "job $job2 submitted: $total steps; signalled once training is under way"
deadline=$((SECONDS + 120))
until [[ -f "$out2/logging.jsonl" && "$(grep -c '"loss":' "$out2/logging.jsonl")" -ge 2 ]]; do
  ((SECONDS < deadline)) || fail "job $job2 logged no 2 steps in 120 s (state $(job_field "$job2" JobState))"
  [[ "$(job_field "$job2" JobState)" =~ ^(PENDING|CONFIGURING|RUNNING)$ ]] || fail "job $job2 ended early: $(job_field "$job2" JobState)"
  sleep 0.5
done
# What --signal=B:USR1@N does at N seconds before the limit: SIGUSR1 to the batch shell only.
scancel --signal=USR1 --batch "$job2"
deadline=$((SECONDS + 90))
until [[ "$(job_field "$job2" Restarts)" == 1 ]]; do
  ((SECONDS < deadline)) || fail "job $job2 was not requeued within 90 s (state $(job_field "$job2" JobState))"
  sleep 0.5
done
preempted="$(grep '^glm_hpc: preempted: SIGUSR1 received; every rank stopped after step ' "$log2" || true)"
[[ -n "$preempted" ]] || fail "no preemption message in $log2"
saved_step="$(sed -E 's/.*stopped after step ([0-9]+) of.*/\1/' <<<"$preempted")"
((saved_step >= 2 && saved_step < total)) || fail "preempted at step '$saved_step'"
grep -q "requeueing job $job2" "$log2" || fail "the batch script did not requeue job $job2"
grep -q "^glm_job: srun " "$log2" || fail "job $job2 did not launch with srun"
# Rank 0's memory line gathers every rank's bytes: all 4 took part.
grep -q "^glm_hpc: memory per rank (ZeRO-[0-3]), ranks 0-3 of 4: " "$log2" || fail "4 ranks did not report in $log2"
ckpt="$out2/checkpoint-$saved_step"
[[ -f "$ckpt/COMPLETE" ]] || fail "no complete checkpoint $ckpt"
[[ "$(cat "$out2/latest")" == "checkpoint-$saved_step" ]] || fail "$out2/latest is not checkpoint-$saved_step"
rank_files="$(find "$ckpt" -maxdepth 1 -type f -name '*.h5' | wc -l)"
[[ "$rank_files" -eq 4 ]] || fail "$ckpt holds $rank_files rank files, not 4"
say "job $job2: every rank stopped after step $saved_step, checkpoint saved, job requeued"

# Slurm holds a requeued job for a while (its BeginTime) before it may start again. Released
# early, it must not meet the first run: wait until that run's slurmstepd processes are gone (a
# new step would find the old one's PMIx socket), then start it a few seconds later (slurmd
# refuses credentials issued in the second it revoked the first run's).
stepds_of() { grep -l -a -F "slurmstepd: [$1." /proc/[0-9]*/cmdline 2>/dev/null || true; }
deadline=$((SECONDS + 60))
until [[ "$(job_field "$job2" JobState)" == PENDING && -z "$(stepds_of "$job2")" ]]; do
  ((SECONDS < deadline)) || fail "job $job2: the first run's slurmstepd still there 60 s after the requeue"
  sleep 0.5
done
scontrol update jobid="$job2" StartTime=now+3
state="$(wait_for_state "$job2" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE' 150)"
[[ "$state" == COMPLETED ]] || fail "requeued job $job2 ended $state, exit $(job_field "$job2" ExitCode)"
grep -q "^glm_job: job $job2 (restart 1)" "$log2" || fail "the requeued run did not start (restart 1) in $log2"
grep -q "^glm_hpc: resumed from $ckpt at step $saved_step" "$log2" || fail "the requeued run did not resume from $ckpt"
# Nothing trained twice: after the resume the steps go on from saved_step + 1 to the end.
resumed_steps="$(sed -n "/^glm_hpc: resumed from/,\$p" "$log2" | grep -oE '^step [0-9]+/' | tr -dc '0-9\n' | tr '\n' ' ')"
expected="$(seq -s ' ' $((saved_step + 1)) $total) "
[[ "$resumed_steps" == "$expected" ]] || fail "after the resume the steps were '$resumed_steps', expected '$expected'"
grep -q "^glm_hpc: done: $total steps" "$log2" || fail "the requeued run did not finish $total steps"
[[ -f "$out2/checkpoint-$total/COMPLETE" ]] || fail "no final checkpoint-$total"
say "job $job2 COMPLETED after the requeue: resumed at step $saved_step, steps $((saved_step + 1))-$total"
say "PASS"
