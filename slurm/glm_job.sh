# shellcheck shell=bash
# Sourced by slurm/train_4gpu.sh and slurm/train_multinode.sh inside the batch job: builds the
# glm_hpc command from the environment and the script's arguments, launches one rank per task
# with mpirun (or srun), forwards Slurm's pre-timeout signal to the ranks, and requeues the job
# when glm_hpc stopped for it (exit 75) so that the requeued job resumes from its checkpoint.
# With GLM_NTASKS and no Slurm job, the same command runs on the host it is started on.
#
# Knobs (environment variables, read when the job starts; sbatch exports the submitting shell's):
#   GLM_HOME         the glm_hpc repository (default: the directory sbatch was run from)
#   GLM_BIN          the glm_hpc binary (default: $GLM_HOME/build/glm_hpc)
#   GLM_CONFIG       --config file (default: the one the calling script names; "" for none)
#   GLM_DATASET      --dataset, one path or several separated by spaces (default: the config's)
#   GLM_OUTPUT_ROOT  where run directories go (default: $GLM_HOME/output)
#   GLM_OUTPUT_DIR   the run directory itself (default: $GLM_OUTPUT_ROOT/slurm-<job id>; the job
#                    id survives a requeue, so the requeued job finds its checkpoints there)
#   GLM_DEVICE       --device auto|cuda|cpu (default auto: cuda when the node has GPUs)
#   GLM_LAUNCHER     mpirun (default; Open MPI takes the allocation from Slurm) or srun (needs a
#                    Slurm MPI plugin matching your MPI: GLM_SRUN_ARGS, default --mpi=pmix)
#   GLM_MPIRUN_ARGS  extra mpirun arguments (e.g. "--bind-to core --map-by ppr:4:node:PE=16")
#   GLM_SRUN_ARGS    extra srun arguments (default --mpi=pmix)
#   GLM_REQUEUE      1 (default): requeue after a preemption stop; 0: exit 75 and leave it
#   GLM_NTASKS       outside Slurm only (no SLURM_JOB_ID): run the same command with this many
#                    ranks on this host through mpirun, output in $GLM_OUTPUT_ROOT/local-<time>
#                    unless named, never requeued (benchmarks/calls/node_x4_call1.sh runs
#                    slurm/train_4gpu.sh so on a 4-GPU machine without Slurm)
# Arguments after the script name go to glm_hpc last and win over everything above; an
# --output_dir or --resume_from_checkpoint among them is used instead of the script's own.
#
# Preemption: "#SBATCH --signal=B:USR1@N" makes Slurm signal this batch shell N seconds before the
# time limit (up to a minute early: Slurm checks once a minute). The trap below forwards SIGUSR1 to
# the launcher (mpirun and srun pass it on to every rank); glm_hpc's ranks agree on it after the
# step in progress, all save a checkpoint of that step, and exit 75. This script then runs
# "scontrol requeue", and the job (same id, same output directory) starts again later with
# --resume_from_checkpoint latest (or from the start, when the signal came before training did:
# glm_hpc then stops at once with the same code). Choose N larger than one step plus one checkpoint
# save.
# SIGTERM (scancel, or the time limit itself) is forwarded the same way, so the ranks save what
# they can before Slurm's KillWait ends them, but it does not requeue: a cancelled job stays so.

readonly GLM_PREEMPTED_EXIT=75  # kStoppedExitCode in base/status.h

glm_log() { echo "glm_job: $*"; }

glm_die() {
  echo "glm_job: error: $*" >&2
  exit 2
}

# True when the glm_hpc arguments name option $1 (as "--x value" or "--x=value").
glm_args_have() {
  local option="$1" a
  shift
  for a in "$@"; do
    [[ "$a" == "$option" || "$a" == "$option="* ]] && return 0
  done
  return 1
}

# The value of option $1 among the arguments (the last one given), or nothing.
glm_args_value() {
  local option="$1" value="" previous="" a
  shift
  for a in "$@"; do
    if [[ "$previous" == "$option" ]]; then value="$a"; fi
    if [[ "$a" == "$option="* ]]; then value="${a#"$option="}"; fi
    previous="$a"
  done
  printf '%s' "$value"
}

# A checkpoint to resume from: the latest marker, or any complete checkpoint directory.
glm_has_checkpoint() {
  local dir="$1"
  [[ -f "$dir/latest" ]] && return 0
  compgen -G "$dir/checkpoint-*/COMPLETE" >/dev/null
}

# Trap handler: hands the signal to the ranks as SIGUSR1 and remembers the first one received.
glm_forward() {
  glm_signal="${glm_signal:-$1}"
  glm_log "SIG$1 received by the batch shell: forwarding SIGUSR1 to the ranks (they checkpoint and exit $GLM_PREEMPTED_EXIT)"
  if [[ -n "${glm_launcher_pid:-}" ]]; then kill -USR1 "$glm_launcher_pid" 2>/dev/null || true; fi
}

# glm_job_run DEFAULT_CONFIG "DEFAULT OPTION PAIRS" [glm_hpc arguments...]: a default option
# ("--zero_stage 3") is passed only when the arguments do not name it (glm_hpc refuses repeats).
glm_job_run() {
  local default_config="$1" default_options="$2"
  shift 2
  local under_slurm=1 ntasks="${SLURM_NTASKS:-1}" run_name="slurm-${SLURM_JOB_ID:-}"
  if [[ -z "${SLURM_JOB_ID:-}" ]]; then
    [[ -n "${GLM_NTASKS:-}" ]] ||
      glm_die "not inside a Slurm job: submit with sbatch (or set SLURM_JOB_ID; GLM_NTASKS=N runs N ranks here without Slurm)"
    [[ "$GLM_NTASKS" =~ ^[1-9][0-9]*$ ]] || glm_die "GLM_NTASKS '$GLM_NTASKS' is not a positive number of ranks"
    [[ "${GLM_LAUNCHER:-mpirun}" == mpirun ]] || glm_die "GLM_NTASKS runs without Slurm, through mpirun only (GLM_LAUNCHER '$GLM_LAUNCHER')"
    under_slurm=0 ntasks="$GLM_NTASKS" run_name="local-$(date +%Y%m%d-%H%M%S)"
  fi
  local home="${GLM_HOME:?}"
  local bin="${GLM_BIN:-$home/build/glm_hpc}"
  [[ -x "$bin" ]] || glm_die "GLM_BIN '$bin' is not an executable: build glm_hpc (bash scripts/build.sh) or set GLM_BIN"
  cd "$home" || glm_die "cannot enter GLM_HOME '$home'"

  local -a args=()
  local config="${GLM_CONFIG-$default_config}"
  if [[ -n "$config" ]] && ! glm_args_have --config "$@"; then
    [[ -f "$config" ]] || glm_die "GLM_CONFIG '$config' does not exist (relative paths start at $home)"
    args+=(--config "$config")
  fi
  if [[ -n "${GLM_DATASET:-}" ]] && ! glm_args_have --dataset "$@"; then
    local -a datasets
    read -r -a datasets <<<"$GLM_DATASET"
    args+=(--dataset "${datasets[@]}")
  fi
  if [[ -n "${GLM_DEVICE:-}" ]] && ! glm_args_have --device "$@"; then args+=(--device "$GLM_DEVICE"); fi
  local -a defaults
  read -r -a defaults <<<"$default_options"
  local i
  for ((i = 0; i + 1 < ${#defaults[@]}; i += 2)); do
    glm_args_have "${defaults[i]}" "$@" || args+=("${defaults[i]}" "${defaults[i + 1]}")
  done

  local out
  if glm_args_have --output_dir "$@"; then
    out="$(glm_args_value --output_dir "$@")"
  else
    out="${GLM_OUTPUT_DIR:-${GLM_OUTPUT_ROOT:-$home/output}/$run_name}"
    args+=(--output_dir "$out")
  fi
  mkdir -p "$out" || glm_die "cannot create the output directory '$out'"
  if ! glm_args_have --resume_from_checkpoint "$@" && glm_has_checkpoint "$out"; then
    args+=(--resume_from_checkpoint latest)
  fi
  args+=("$@")

  local -a launch
  case "${GLM_LAUNCHER:-mpirun}" in
    mpirun)
      launch=(mpirun -np "$ntasks")
      if [[ -n "${SLURM_NTASKS_PER_NODE:-}" ]]; then launch+=(--map-by "ppr:${SLURM_NTASKS_PER_NODE%%(*}:node"); fi
      # The ranks bind nothing by default (each drives one GPU and its own threads); see GLM_MPIRUN_ARGS.
      launch+=(--bind-to none)
      # Exported network and library knobs reach every node's ranks explicitly.
      local name
      for name in $(compgen -e); do
        case "$name" in NCCL_* | UCX_* | GLM_* | OMP_NUM_THREADS | HDF5_*) launch+=(-x "$name") ;; esac
      done
      if [[ -n "${GLM_MPIRUN_ARGS:-}" ]]; then
        local -a extra
        read -r -a extra <<<"$GLM_MPIRUN_ARGS"
        launch+=("${extra[@]}")
      fi
      ;;
    srun)
      # Since Slurm 22.05 srun does not take --cpus-per-task from the job; this hands it on.
      if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"; fi
      local -a extra
      read -r -a extra <<<"${GLM_SRUN_ARGS:---mpi=pmix}"
      # Seen with Slurm 22.05: srun may exit 0 when its step fails to launch ("task N launch
      # failed" in the log), so this script cannot tell that from success; mpirun reports it.
      launch=(srun --kill-on-bad-exit=1 "${extra[@]}")
      ;;
    *) glm_die "GLM_LAUNCHER '$GLM_LAUNCHER' is not mpirun or srun" ;;
  esac

  if [[ $under_slurm == 1 ]]; then
    glm_log "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-$(hostname)}: $ntasks ranks, output $out"
  else
    glm_log "no Slurm job: $ntasks ranks on $(hostname) (GLM_NTASKS), output $out"
  fi
  glm_log "${launch[*]} $bin ${args[*]}"

  # Signals: forward, remember which. The trap interrupts "wait", so wait until the launcher exits.
  glm_signal=""
  glm_launcher_pid=""
  trap 'glm_forward USR1' USR1
  trap 'glm_forward TERM' TERM

  "${launch[@]}" "$bin" "${args[@]}" &
  glm_launcher_pid=$!
  local rc
  while kill -0 "$glm_launcher_pid" 2>/dev/null; do
    wait "$glm_launcher_pid" && break
    [[ $? -eq 127 ]] && break  # not our child any more
  done
  wait "$glm_launcher_pid" && rc=0 || rc=$?
  trap - USR1 TERM

  if [[ $rc -eq $GLM_PREEMPTED_EXIT ]]; then
    if [[ "$glm_signal" == "USR1" && "${GLM_REQUEUE:-1}" == "1" && $under_slurm == 1 ]]; then
      glm_log "glm_hpc stopped for preemption (after a checkpoint in $out if training had begun); requeueing job $SLURM_JOB_ID: it resumes from the latest checkpoint, if any"
      scontrol requeue "$SLURM_JOB_ID" || glm_die "scontrol requeue $SLURM_JOB_ID failed (is the job requeueable? --requeue, JobRequeue)"
    else
      glm_log "glm_hpc stopped (after a checkpoint in $out if training had begun; exit $rc); not requeued (signal ${glm_signal:-to the ranks directly}, GLM_REQUEUE=${GLM_REQUEUE:-1})"
    fi
  elif [[ $rc -ne 0 ]]; then
    glm_log "glm_hpc failed with exit code $rc"
  else
    glm_log "glm_hpc finished; output in $out"
  fi
  return "$rc"
}
