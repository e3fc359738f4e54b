#!/usr/bin/env bash
# The plumbing of the 4- and 8-GPU calls (benchmarks/calls/node_*_call*.sh) on the CPU, without a GPU:
# a stand-in nvidia-smi that reports N GPUs, build-gpu/ a link to the CPU build, and glm_hpc
# wrapped to train the tiny model (GLM-4-9B's vocabulary) at seq 64 on --device cpu, 3 steps a run.
# Deadlines, steps, summaries, the scaling table, the checkpoint bundle and the packing of $OUT run
# for real; bench_comm, the FSDP2 peer and the 9B sweeps fail and test_nccl skips, as they must
# without GPUs. Nothing is built. Usage, from the repository root:
#   bash benchmarks/calls/node_dry_run.sh benchmarks/calls/node_x4_call1.sh 4 [STEP NAME...]
# Env: GLM_CPU_BUILD (default build: the CPU build directory), OUT (default /tmp/node_dry_out).
set -uo pipefail
script=${1:?usage: node_dry_run.sh CALL_SCRIPT GPUS [STEP NAME...]} gpus=${2:?number of GPUs to pretend}
shift 2
cd "$(dirname "$0")/../.." || exit 1
cpu_build=$(cd "${GLM_CPU_BUILD:-build}" && pwd) || exit 1
[ -x "$cpu_build/glm_hpc" ] || { echo "error: no $cpu_build/glm_hpc (bash scripts/build.sh builds it)"; exit 1; }
if [ -e build-gpu ] && [ ! -L build-gpu ]; then
  echo "error: build-gpu/ is a real build here; this would replace it with a link"; exit 1
fi
fake=$(mktemp -d /tmp/node_dry.XXXXXX)
trap 'rm -rf "$fake"; [ -L build-gpu ] && rm -f build-gpu' EXIT
ln -sfn "$cpu_build" build-gpu

cat >"$fake/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# Stand-in: FAKE_GPUS GPUs; memory samples every 0.2 s until killed.
n=${FAKE_GPUS:-4}
case "$*" in
  -L) for i in $(seq 0 $((n - 1))); do echo "GPU $i: stand-in H200 (UUID: GPU-$i)"; done ;;
  *index,memory.used*)
    ids=$(sed -E 's/.*-i ([0-9,]+).*/\1/' <<<"$*")
    while true; do for i in ${ids//,/ }; do echo "$i, $((1000 + RANDOM % 100))"; done; sleep 0.2; done ;;
  *name,memory.total*) for i in $(seq 0 $((n - 1))); do echo "stand-in H200, 143771 MiB, 0"; done ;;
  *name*) echo "stand-in H200" ;;
esac
EOF
cat >"$fake/glm_hpc" <<EOF
#!/usr/bin/env bash
# Stand-in for build-gpu/glm_hpc: the CPU build, rows cut to 64 tokens, --device cpu.
args=()
while [ \$# -gt 0 ]; do
  case "\$1" in
    --max_length) args+=(--max_length 64 --truncation_strategy right); shift 2 ;;
    --device) args+=(--device cpu); shift 2 ;;
    *) args+=("\$1"); shift ;;
  esac
done
exec "$cpu_build/glm_hpc" "\${args[@]}"
EOF
chmod +x "$fake/nvidia-smi" "$fake/glm_hpc"
rm -f /tmp/glm_node/zero_results.jsonl  # this machine's rows: only this dry run's
export OUT=${OUT:-/tmp/node_dry_out}
rm -rf "$OUT" && mkdir -p "$OUT"
PATH=$fake:$PATH FAKE_GPUS=$gpus GLM_NODE_SKIP_BUILD=1 GLM_BIN=$fake/glm_hpc GLM_DEVICE=cpu \
  GLM_MODEL_ARGS="--config configs/glm4-tiny.cfg --vocab_size 151552" GLM_NODE_ZERO_STEPS=3 \
  GLM_NODE_SWEEP_BYTES=16M GLM_NODE_STEPS="$*" bash "$script"
echo "dry run: \$OUT is $OUT: $(ls -s "$OUT" | tr '\n' ' ')"
