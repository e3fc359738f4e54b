# shellcheck shell=bash
# Sourced by benchmarks/node_x4_call*.sh and node_x8_call*.sh: the calls of issues 11 and 12 on a
# 4- or 8-GPU machine of the device tool (one bash command a call, 600 s at most, a bare machine
# each session, warm for only 30 s after a call, at most 8 files of 16 MiB back from $OUT). Each
# call builds (a no-op on a warm machine), runs its steps through the existing scripts under a
# deadline (benchmarks/calls/steps.sh), prints the tables and step table last, and packs $OUT into:
#   summary_<call>.txt        what the call printed at the end (the tables)
#   logs_<call>.tar.gz        every log, the runs' logging.jsonl and args.json, CSVs and JSON
#   zero_results_<call>.jsonl the ZeRO rows of this machine so far (benchmarks/calls/zero_scaling.py)
#   and the call's own files (sweep PNGs, the checkpoint bundle).
# Knobs: GLM_CALL_BUDGET (seconds until the last step must end, default 560), GLM_NODE_STEPS
# (step names to run besides the build, e.g. to re-run what a call skipped for its deadline:
# GLM_NODE_STEPS="sweep_z3 zero3_4gpu" bash benchmarks/calls/node_x8_call4.sh), GLM_NODE_SKIP_BUILD=1
# (build-gpu/ is there already), GLM_NODE_ZERO_STEPS (30), GLM_NODE_SWEEP_BYTES (16M,256M,1G).
# benchmarks/calls/node_dry_run.sh runs a call's plumbing on the CPU (stand-in nvidia-smi, tiny model).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
: "${NODE_CALL:?set by the call script, e.g. x4_1}"
NODE_DIR=/tmp/glm_node                     # stays while the machine stays warm
NODE_LOGS=$NODE_DIR/$NODE_CALL
NODE_RESULTS=$NODE_DIR/zero_results.jsonl  # the ZeRO rows of every call on this machine
rm -rf "$NODE_LOGS" && mkdir -p "$NODE_LOGS"
STEP_LOG_DIR=$NODE_LOGS
STEP_DEADLINE=$(($(date +%s) + ${GLM_CALL_BUDGET:-560}))
STEP_ONLY=${GLM_NODE_STEPS:-}
source benchmarks/calls/steps.sh
NODE_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
node_summary=()  # lines for the summary, added by the steps' readers below
echo "call $NODE_CALL on $NODE_GPUS GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)), $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null)"

node_build() {  # node_build TARGET...: gpu_session.sh's build of these targets into build-gpu/
  [ "${GLM_NODE_SKIP_BUILD:-0}" = 1 ] && return 0
  local jobs
  jobs=$(nproc); [ "$jobs" -gt 64 ] && jobs=64
  mkdir -p "$NODE_LOGS/build"
  # Always (GLM_NODE_STEPS or not): a no-op on a warm machine, the binaries on a bare one.
  STEP_ONLY="" step build 420 env OUT="$NODE_LOGS/build" GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="$*" GLM_BUILD_JOBS="$jobs" \
    bash benchmarks/calls/gpu_session.sh
  node_summary+=("build: $(grep -E '^build: ' "$NODE_LOGS/build.log" || echo 'failed, see build.log and build/build.log')")
}

# node_zero NAME GPUS SEQ STAGE [LAUNCHER]: benchmarks/calls/zero_x2.sh, one ZeRO stage, no peer.
node_zero() {
  local name=$1 gpus=$2 seq_len=$3 stage=$4 launcher=${5:-}
  step "$name" 240 env OUT="$NODE_LOGS" GLM_ZERO_GPUS="$gpus" GLM_ZERO_SEQ="$seq_len" \
    GLM_ZERO_STEPS="${GLM_NODE_ZERO_STEPS:-30}" GLM_ZERO_RUNS="$stage:none" GLM_SKIP_PEERS=1 \
    GLM_ZERO_RESULTS="$NODE_RESULTS" GLM_ZERO_LAUNCHER="$launcher" bash benchmarks/calls/zero_x2.sh
}

# node_peer NAME GPUS SEQ MODES: the FSDP2 peer through zero_x2.sh (no runs of ours).
node_peer() {
  local name=$1 gpus=$2 seq_len=$3 modes=$4
  step "$name" 300 env OUT="$NODE_LOGS" GLM_ZERO_GPUS="$gpus" GLM_ZERO_SEQ="$seq_len" GLM_ZERO_RUNS= \
    GLM_PEER_MODES="$modes" GLM_ZERO_RESULTS="$NODE_RESULTS" bash benchmarks/calls/zero_x2.sh
  local lines
  lines=$(grep '^peer' "$NODE_LOGS/$name.log" | tr '\n' ' ')
  node_summary+=("$name: ${lines:-no peer result (see $name.log and fsdp_peer*.log)}")
}

node_test_nccl() {  # node_test_nccl N: the NCCL collectives and ZeRO stages against MPI at world size N
  local n=$1
  # mpirun hands the ranks a terminal, so gtest would colour its lines.
  step "test_nccl_np$n" 240 mpirun -np "$n" --bind-to none build-gpu/tests/test_nccl --gtest_color=no
  local log=$NODE_LOGS/test_nccl_np$n.log
  local line  # gtest's closing line of every rank, counted: "8 ranks: [  PASSED  ] 7 tests."
  while IFS= read -r line; do node_summary+=("test_nccl at $n ranks: $line"); done < <(
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^\[ +(PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?' | sort | uniq -c | sed 's/^ *\([0-9]*\) /\1 ranks: /')
}

node_comm() {  # bench_comm on every GPU and PyTorch's NCCL calls beside it (comm_x2.sh)
  step bench_comm 300 env OUT="$NODE_LOGS" bash benchmarks/calls/comm_x2.sh
  local line
  while IFS= read -r line; do node_summary+=("bench_comm: $line"); done < <(sed -n '/== busbw at 1 GiB/,$p' "$NODE_LOGS/bench_comm.log")
}

# node_sweep STAGE: the trainer bucket sweep at one ZeRO stage on every GPU (bucket_sweep_gpu.sh),
# one stage a step so that a deadline cut keeps the stages already swept; its PNG goes to $OUT.
node_sweep() {
  local stage=$1 dir=$NODE_LOGS/sweep_z$1
  mkdir -p "$dir"
  step "sweep_z$stage" 300 env OUT="$dir" GLM_SWEEP_STAGES="$stage" GLM_SWEEP_BYTES="${GLM_NODE_SWEEP_BYTES:-16M,256M,1G}" \
    GLM_SWEEP_OVERLAP=true,false GLM_SWEEP_STEPS=5 bash benchmarks/calls/bucket_sweep_gpu.sh
  [ -s "$dir/sweep/bucket_sweep.png" ] && cp "$dir/sweep/bucket_sweep.png" "$OUT/sweep_z${stage}_x$NODE_GPUS.png"
  local line
  while IFS= read -r line; do node_summary+=("sweep ZeRO-$stage: $line"); done < <(grep -E "^best|^auto at|reduce_bucket_size auto" "$NODE_LOGS/sweep_z$stage.log")
}

# node_checkpoint N: the tiny model saved on N GPUs (bundle to $OUT), resumed on 2 of them at once.
node_checkpoint() {
  local n=$1 bundle=$OUT/ckpt_x$1.tar.gz
  step "ckpt_save_np$n" 150 bash benchmarks/checks/resume_across_world_sizes.sh save "$n" "$bundle"
  step ckpt_resume_np2 150 bash benchmarks/checks/resume_across_world_sizes.sh resume "$bundle" 2
  local line
  while IFS= read -r line; do node_summary+=("checkpoint: $line"); done < <(grep -hE "^bundle:|^worst" "$NODE_LOGS/ckpt_save_np$n.log" "$NODE_LOGS/ckpt_resume_np2.log")
  node_summary+=("checkpoint: later, on a 2-GPU machine: copy ckpt_x$n.tar.gz into .node/ of the checkout (.gitignore has it), then run with carry [\".deb\", \".node\"]:")
  node_summary+=("  GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS=glm_hpc bash benchmarks/calls/gpu_session.sh && bash benchmarks/checks/resume_across_world_sizes.sh resume .node/ckpt_x$n.tar.gz 2")
}

node_plan_one_gpu() {  # why the scaling table has no 1-GPU column: the planner's peak on one GPU
  step plan_1gpu 30 build-gpu/glm_hpc plan --config configs/glm4-9b-chat.cfg --world_size 1 --max_length 4096 \
    --per_device_train_batch_size 1 --zero_stage 0
  node_summary+=("1 GPU, ZeRO-0, seq 4096, glm_hpc plan:$(grep -E 'total \(predicted peak\)|^fits in' "$NODE_LOGS/plan_1gpu.log" | tr -s ' ' | tr '\n' ';')")
}

# node_finish TARGET: the tables (zero_scaling.py over this machine's rows), the summary lines, the
# step table; then $OUT packed (at most 8 files, each under 16 MiB).
node_finish() {
  local target=$1 summary=$OUT/summary_$NODE_CALL.txt
  {
    if [ -s "$NODE_RESULTS" ]; then python3 benchmarks/calls/zero_scaling.py "$NODE_RESULTS" --target "$target"; fi
    echo
    echo "== call $NODE_CALL =="
    printf '%s\n' "${node_summary[@]}"
    step_table
  } 2>&1 | tee "$summary"
  [ -s "$NODE_RESULTS" ] && cp "$NODE_RESULTS" "$OUT/zero_results_$NODE_CALL.jsonl"
  # The runs' own records (small) next to the logs; build logs and memory samples go last if the
  # archive is too large.
  local runs=() d
  for d in /tmp/zero_* /tmp/glm_resume/straight /tmp/glm_resume/resumed /tmp/sweep_auto_*; do
    [ -d "$d" ] && runs+=("${d#/tmp/}")
  done
  local tarball=$OUT/logs_$NODE_CALL.tar.gz
  tar czf "$tarball" --exclude='*.h5' -C "$NODE_DIR" "$NODE_CALL" -C /tmp "${runs[@]}" 2>/dev/null
  if [ "$(stat -c %s "$tarball")" -gt $((15 << 20)) ]; then
    tar czf "$tarball" --exclude='*.h5' --exclude='build' --exclude='mem_*.csv' -C "$NODE_DIR" "$NODE_CALL" 2>/dev/null
  fi
  echo "files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}
