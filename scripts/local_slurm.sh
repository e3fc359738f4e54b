#!/usr/bin/env bash
# A one-host Slurm to try `sbatch slurm/train_4gpu.sh` (and the other slurm/ scripts) on this
# machine: Debian's munge, slurmctld and slurmd (scripts/setup.sh installs them), run with their own
# key, socket, state, logs and ports under one directory, as one node and one partition.
#
#   scripts/local_slurm.sh up [--gpus N] [--cpus N]   start it; prints the line that points sbatch at it
#   scripts/local_slurm.sh status                      the node, the queue and the daemons
#   scripts/local_slurm.sh down [--keep]               cancel every job, stop the daemons, remove the
#                                                      directory (--keep: leave it, with the logs)
#
# The directory is $GLM_SLURM_DIR (default /tmp/glm_hpc_slurm). The node has --gpus GPUs: this
# machine's /dev/nvidia0.. when it has them (default: all of them), else names of /dev/null, and
# glm_hpc then runs its CPU backend (GLM_DEVICE=cpu); --cpus defaults to 64, more than the machine
# may have (SlurmdParameters=config_overrides): the ranks share its cores. slurmd starts jobs as
# their users, so it runs as root.
set -euo pipefail

dir="${GLM_SLURM_DIR:-/tmp/glm_hpc_slurm}"
die() {
  echo "local_slurm: error: $*" >&2
  exit 1
}
say() { echo "local_slurm: $*"; }

conf="$dir/etc/slurm.conf"
running() { [[ -f "$dir/pids" ]] && [[ -n "$(cat "$dir/pids")" ]]; }

stop_daemons() {  # newest first: slurmd, slurmctld, munged
  [[ -f "$dir/pids" ]] || return 0
  local -a pids
  read -r -a pids <<<"$(tac "$dir/pids" | tr '\n' ' ')"
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  : >"$dir/pids"
}

cmd_down() {
  local keep=0
  [[ "${1:-}" == "--keep" ]] && keep=1
  if [[ -f "$conf" ]]; then
    # Jobs first (their processes belong to slurmd's steps), then the daemons.
    local -a jobs
    read -r -a jobs <<<"$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
    ((${#jobs[@]} == 0)) || SLURM_CONF="$conf" scancel --full --quiet "${jobs[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while [[ -n "$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.5; done
  fi
  stop_daemons
  if ((keep)); then
    say "stopped; $dir kept"
  else
    rm -rf "$dir"
    say "stopped; $dir removed"
  fi
}

cmd_status() {
  running || {
    say "not running (no daemons recorded in $dir)"
    return 1
  }
  local pid alive=0
  while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done <"$dir/pids"
  say "$alive of $(wc -l <"$dir/pids") daemons alive; SLURM_CONF=$conf"
  SLURM_CONF="$conf" sinfo -N -o '%N %T %C %G' || true
  SLURM_CONF="$conf" squeue || true
}

# Two free ports: a connection attempt that fails means nobody listens there.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 30000))
    if port_free "$p" && port_free "$((p + 1))"; then
      echo "$p"
      return
    fi
  done
  die "no free TCP port pair found"
}

cmd_up() {
  local gpus="" cpus=64
  while (($#)); do
    case "$1" in
      --gpus) gpus="${2:?--gpus needs a number}"; shift 2 ;;
      --cpus) cpus="${2:?--cpus needs a number}"; shift 2 ;;
      *) die "unknown argument '$1' (up takes --gpus N and --cpus N)" ;;
    esac
  done
  [[ "$(id -u)" -eq 0 ]] || die "slurmd starts jobs as their users and must run as root (SlurmdUser=root)"
  local cmd
  for cmd in munged munge slurmctld slurmd sbatch scontrol squeue scancel sinfo; do
    command -v "$cmd" >/dev/null || die "'$cmd' not found: run scripts/setup.sh (it installs munge, slurmctld, slurmd and slurm-client)"
  done
  if running; then
    die "already up in $dir (scripts/local_slurm.sh status; down first to start another)"
  fi
  local -a devices=()
  local d
  for d in /dev/nvidia[0-9]*; do [[ -e "$d" ]] && devices+=("$d"); done
  [[ -n "$gpus" ]] || gpus=$((${#devices[@]} > 0 ? ${#devices[@]} : 4))
  [[ "$gpus" =~ ^[0-9]+$ && "$cpus" =~ ^[1-9][0-9]*$ ]] || die "--gpus and --cpus take whole numbers"

  mkdir -p "$dir"/{munge,etc,ctld,spool,log,dev}
  chmod 755 "$dir" "$dir/munge"
  : >"$dir/pids"
  local ctld_port slurmd_port host
  ctld_port="$(pick_port)"
  slurmd_port=$((ctld_port + 1))
  host="$(hostname -s)"

  # munge: a key and a socket of its own.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  setsid munged --foreground --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed" \
    >"$dir/log/munged.out" 2>&1 </dev/null &
  echo $! >>"$dir/pids"
  local deadline=$((SECONDS + 15))
  until munge --socket="$dir/munge/socket" --no-input >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { stop_daemons; die "munged did not start: $(cat "$dir/log/munged.out")"; }
    sleep 0.2
  done

  # The node's GPUs: this machine's devices when it has enough, else names of /dev/null (gres/gpu
  # needs device files; task/none constrains no devices).
  local gres_file="" i
  if ((gpus > 0)); then
    if ((${#devices[@]} >= gpus)); then
      gres_file="/dev/nvidia[0-$((gpus - 1))]"
    else
      for ((i = 0; i < gpus; i++)); do ln -sf /dev/null "$dir/dev/gpu$i"; done
      gres_file="$dir/dev/gpu[0-$((gpus - 1))]"
    fi
  fi
  cat >"$conf" <<EOF
ClusterName=glmlocal
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmdPidFile=$dir/spool/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
# Finished jobs stay visible to scontrol for a while.
MinJobAge=600
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus$( ((gpus > 0)) && echo " Gres=gpu:$gpus") State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  if ((gpus > 0)); then
    echo "NodeName=$host Name=gpu File=$gres_file" >"$dir/etc/gres.conf"
  else
    : >"$dir/etc/gres.conf"
  fi
  echo "export SLURM_CONF=$conf" >"$dir/env"

  SLURM_CONF="$conf" setsid slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 </dev/null &
  echo $! >>"$dir/pids"
  SLURM_CONF="$conf" setsid slurmd -D -N "$host" >"$dir/log/slurmd.out" 2>&1 </dev/null &
  echo $! >>"$dir/pids"
  deadline=$((SECONDS + 40))
  until [[ "$(SLURM_CONF="$conf" sinfo -h -N -o %T 2>/dev/null)" == "idle" ]]; do
    if ((SECONDS >= deadline)); then
      local state
      state="$(SLURM_CONF="$conf" sinfo -h -N -o '%T %E' 2>&1 || true)"
      stop_daemons
      die "the node did not become idle: sinfo says '$state'; slurmd: $(tail -n 5 "$dir/log/slurmd.out")"
    fi
    local pid
    while read -r pid; do
      kill -0 "$pid" 2>/dev/null || { stop_daemons; die "a Slurm daemon exited at start (logs in $dir/log)"; }
    done <"$dir/pids"
    sleep 0.5
  done
  say "up on $host: 1 node, $cpus CPUs, $gpus GPUs$( ((gpus > 0 && ${#devices[@]} < gpus)) && echo " (names of /dev/null: use GLM_DEVICE=cpu)") (slurmctld :$ctld_port, slurmd :$slurmd_port)"
  say "point sbatch, squeue and scancel at it: source $dir/env"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) cmd_status ;;
  *) die "usage: scripts/local_slurm.sh up [--gpus N] [--cpus N] | status | down [--keep]" ;;
esac
