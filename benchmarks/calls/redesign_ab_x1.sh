#!/usr/bin/env bash
# One single-H200 call for a redesign that must keep behaviour and speed: builds this tree and a
# reference commit's tree (.old/old.tar.gz, made with `git archive --format=tar.gz -o
# .old/old.tar.gz COMMIT`, carried) side by side, runs the CUDA op tests of this tree, compares the
# tiny model's CUDA and CPU losses, then the 12-layer GLM-4-9B-shaped step (seq 4096, no clipping)
# with the old and the new binary alternately. Prints a short table last. GLM_AB_CTEST=1 builds every
# target and runs `ctest -L gpu` instead of test_cuda_ops alone; GLM_AB_FIXTURES=NAME regenerates that
# parity fixture with transformers (tools/make_parity_fixtures.py) into $OUT/fixtures.
# GLM_AB_BENCH=REGEX also builds both trees' bench_kernels and runs the benchmarks it matches with
# each, old first (a benchmark the old tree lacks prints nothing there); GLM_AB_BENCH_OLD=0 runs the
# new tree's alone. GLM_AB_GTEST_FILTER narrows test_cuda_ops (without GLM_AB_CTEST). GLM_AB_STEPS
# sets the 12-layer runs' steps (25; 0 leaves them out); GLM_AB_TINY=0 leaves out the tiny model's
# CUDA-against-CPU losses.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
root=$PWD
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xzf .old/old.tar.gz -C /tmp/old && cp -r .deb /tmp/old/
old_session=$(ls /tmp/old/benchmarks/gpu_session.sh /tmp/old/benchmarks/calls/gpu_session.sh 2>/dev/null | head -1)
t0=$(date +%s)
old_targets="glm_hpc"; [ -n "${GLM_AB_BENCH:-}" ] && [ "${GLM_AB_BENCH_OLD:-1}" = 1 ] && old_targets="glm_hpc bench_kernels"
(cd /tmp/old && GLM_BUILD_JOBS=8 GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="$old_targets" OUT=/tmp/old_out bash "$old_session" \
  >"$OUT/old_build.txt" 2>&1; echo "old build rc=$?" >>"$OUT/old_build.txt") &
old_pid=$!
if [ -n "${GLM_AB_FIXTURES:-}" ]; then
  (python3 tools/make_parity_fixtures.py /tmp/fixtures >"$OUT/fixtures.log" 2>&1; echo "fixtures rc=$?" >>"$OUT/fixtures.log"
   mkdir -p "$OUT/fixtures"; for f in $GLM_AB_FIXTURES; do cp -r "/tmp/fixtures/$f" "$OUT/fixtures/"; done) &
  fixtures_pid=$!
fi
new_targets="glm_hpc test_cuda_ops"; [ -n "${GLM_AB_BENCH:-}" ] && new_targets="$new_targets bench_kernels"
[ "${GLM_AB_CTEST:-0}" = 1 ] && new_targets=""
GLM_BUILD_JOBS=10 GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="$new_targets" bash benchmarks/calls/gpu_session.sh ||
  { echo "new build failed"; exit 1; }
wait $old_pid
tail -2 "$OUT/old_build.txt"
echo "builds: $(( $(date +%s) - t0 )) s"
if [ "${GLM_AB_CTEST:-0}" = 1 ]; then
  (cd build-gpu && timeout 400 ctest -L gpu -E test_nccl --timeout 300 >"$OUT/ctest_gpu.log" 2>&1; echo "ctest -L gpu rc=$?")
  grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest_gpu.log" | head -20
else
  timeout 240 build-gpu/tests/test_cuda_ops --gtest_brief=1 --gtest_filter="${GLM_AB_GTEST_FILTER:-*}" \
    >"$OUT/test_cuda_ops.log" 2>&1
  echo "test_cuda_ops rc=$?"; grep -E "PASSED|FAILED|SKIPPED \]" "$OUT/test_cuda_ops.log" | head -20
fi
if [ -n "${GLM_AB_FIXTURES:-}" ]; then wait "$fixtures_pid"; tail -3 "$OUT/fixtures.log"; fi
tiny_devices="cuda cpu"; [ "${GLM_AB_TINY:-1}" = 0 ] && tiny_devices=""  # GLM_AB_TINY=0: no tiny-model loss check
for dev in $tiny_devices; do
  timeout 120 mpirun -np 1 build-gpu/glm_hpc --device $dev --max_steps 50 --logging_steps 1 --overwrite_output_dir true --output_dir /tmp/tiny_$dev \
    >"$OUT/tiny_$dev.log" 2>&1 || { echo "tiny $dev failed"; tail -5 "$OUT/tiny_$dev.log"; }
done
[ -n "$tiny_devices" ] && python3 - <<'PY'
import json
def losses(d): return [json.loads(l)["loss"] for l in open(f"/tmp/tiny_{d}/logging.jsonl") if '"loss"' in l]
try:
    c, g = losses("cpu"), losses("cuda")
    print("tiny cuda vs cpu: %d steps, worst relative loss gap %.2e" % (len(c), max(abs(a - b) / abs(b) for a, b in zip(g, c))))
except Exception as e: print("tiny comparison failed:", e)
PY
if [ -n "${GLM_AB_BENCH:-}" ]; then
  sides="old new"; [ "${GLM_AB_BENCH_OLD:-1}" = 1 ] || sides=new
  for side in $sides; do
    bin=$([ $side = old ] && echo /tmp/old/build-gpu/benchmarks/bench_kernels || echo "$root/build-gpu/benchmarks/bench_kernels")
    timeout 240 "$bin" --benchmark_color=false --benchmark_filter="$GLM_AB_BENCH" >"$OUT/bench_$side.txt" 2>&1 || echo "bench_kernels $side rc=$?"
  done
fi
data=/tmp/bench4096.jsonl
python3 - "$data" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(16): f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
steps=${GLM_AB_STEPS:-25}
rounds="1 2"; [ "$steps" = 0 ] && rounds=""  # GLM_AB_STEPS=0: no 12-layer runs
for round in $rounds; do
  for side in old new; do
    bin=$([ $side = old ] && echo /tmp/old/build-gpu/glm_hpc || echo "$root/build-gpu/glm_hpc")
    dir=/tmp/ab_${side}_$round; rm -rf "$dir"
    timeout 150 env CUDA_VISIBLE_DEVICES=0 mpirun -np 1 --bind-to none "$bin" --device cuda \
      --config configs/glm4-9b-chat.cfg --num_hidden_layers 12 --dataset "$data" --max_length 4096 \
      --gradient_accumulation_steps 1 --max_steps "$steps" --logging_steps 1 --warmup_steps 0 --save_strategy no \
      --max_grad_norm 0 --output_dir "$dir" >"$OUT/ab_${side}_$round.log" 2>&1 || { echo "$side $round failed"; tail -4 "$OUT/ab_${side}_$round.log"; }
  done
done
python3 - <<'PY'
import json, glob
print("\n== 12 layers, seq 4096, no clipping, 1 x H200: old (reference commit) vs new ==")
for side in ("old", "new"):
    for d in sorted(glob.glob(f"/tmp/ab_{side}_*")):
        try:
            r = [json.loads(l) for l in open(f"{d}/logging.jsonl") if '"loss"' in l][3:]
            print("%-10s %8.0f tokens/s over %d steps, final loss %.6f, %.1f GiB" % (d.split("/")[-1], sum(x["tokens_per_second"] for x in r) / len(r), len(r), r[-1]["loss"], max(x.get("device_memory_gib", 0) for x in r)))
        except Exception as e: print(d, "no result:", e)
PY
if [ -n "${GLM_AB_BENCH:-}" ]; then
  for side in old new; do
    [ -f "$OUT/bench_$side.txt" ] || continue
    echo "== bench_kernels, $side =="; grep -E "^BM_" "$OUT/bench_$side.txt" | awk '{print $1, $2, $3, $NF}'
  done
fi
