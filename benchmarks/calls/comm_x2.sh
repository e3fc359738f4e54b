#!/usr/bin/env bash
# bench_comm over NCCL on the GPUs of one host (bf16 and f32, 1 KiB to 4 GiB), its busbw at 1 GiB,
# and PyTorch's NCCL calls at 1 GiB bf16 in the same call (benchmarks/peers/torch_nccl_bench.py)
# with our/torch ratios. Needs build-gpu/benchmarks/bench_comm, which
#   GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="bench_comm test_bench_comm" bash benchmarks/calls/gpu_session.sh
# builds alone (with its test: ctest -R bench_comm in build-gpu). GLM_COMM_MAX_BYTES (default 4G) and GLM_COMM_GPUS (default all) narrow the run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
gpus=${GLM_COMM_GPUS:-$(nvidia-smi -L | wc -l)}
ours=$OUT/bench_comm_x$gpus.json peer=$OUT/torch_nccl_x$gpus.json
rm -f "$ours" "$peer"

timeout 500 mpirun -np "$gpus" --bind-to none build-gpu/benchmarks/bench_comm --backend nccl --dtype both \
  --min_bytes 1K --max_bytes "${GLM_COMM_MAX_BYTES:-4G}" --json "$ours" >"$OUT/bench_comm_x$gpus.log" 2>&1
rc=$?
cat "$OUT/bench_comm_x$gpus.log"
[ $rc -eq 0 ] || echo "bench_comm failed: rc=$rc"

# The peer: same GPUs, same NCCL settings, same size and iterations.
if [ "${GLM_SKIP_PEERS:-0}" != 1 ] && python3 -c "import torch" 2>/dev/null; then
  timeout 300 torchrun --standalone --nproc_per_node "$gpus" benchmarks/peers/torch_nccl_bench.py --bytes 1G \
    --dtype bf16 --json "$peer" >"$OUT/torch_nccl_x$gpus.log" 2>&1 ||
    { echo "torch peer failed"; tail -5 "$OUT/torch_nccl_x$gpus.log"; }
  grep "^peer" "$OUT/torch_nccl_x$gpus.log"
fi

python3 - "$ours" "$peer" <<'PY'
import json, sys
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
ours, peer = load(sys.argv[1]), load(sys.argv[2])
if not ours:
    sys.exit("no bench_comm JSON")
at = {(r["collective"], r["type"]): r for r in ours["rows"] if r["size"] == 1 << 30}
print(f"\n== busbw at 1 GiB, {ours['world_size']} GPUs, NCCL through glm::Communicator (GB/s) ==")
theirs = {r["collective"]: r for r in (peer or {}).get("rows", []) if r["type"] == "bf16"}
for name in ("all_reduce", "reduce_scatter", "all_gather"):
    line = f"{name:15s}"
    for t in ("bf16", "f32"):
        r = at.get((name, t))
        line += f"  {t} {r['busbw']:7.1f}" if r else f"  {t}       -"
    r, p = at.get((name, "bf16")), theirs.get(name)
    if r and p and p["busbw"] > 0:
        line += f"   torch bf16 {p['busbw']:7.1f}   ours/torch {r['busbw'] / p['busbw']:.3f}"
    print(line)
print(f"average busbw over all {len(ours['rows'])} rows: {ours['avg_busbw']:.2f} GB/s")
PY
