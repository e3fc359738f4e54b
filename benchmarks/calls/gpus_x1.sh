#!/usr/bin/env bash
# One single-H200 call for the GPUs users own (issue 31): the default fat build (sm_80, 86, 89, 90a),
# its architectures as cuobjdump lists them, `ctest -L gpu` (with the A100's and the RTX 4090's
# kernel paths forced: the *_a100 and *_rtx4090 entries), attention forward and backward at seq 4096
# and 8192 with each GPU's kernels, a GLM-4-9B-shaped model cut to 4 layers at seq 4096 trained with
# each GPU's kernels, and the offloaded optimizer at gradient accumulation 16 against the optimizer
# on the GPU. Carries .deb. Prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source benchmarks/calls/steps.sh
STEP_DEADLINE=$(( $(date +%s) + ${GLM_CALL_SECONDS:-560} ))
step build 300 env GLM_BUILD_JOBS=16 GLM_ONLY_BUILD=1 GLM_CUDA_ARCHS=default bash benchmarks/calls/gpu_session.sh ||
  { tail -30 "$OUT/build.log"; step_table; exit 1; }
cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
step archs 30 bash -c "'$cuobjdump' --list-elf build-gpu/glm_hpc | grep -o 'sm_[0-9]*a\?' | sort | uniq -c; \
  '$cuobjdump' --list-ptx build-gpu/glm_hpc | grep -o 'sm_[0-9]*a\?' | sort | uniq -c | sed 's/$/ (PTX)/'"
step ctest_gpu 200 bash -c "cd build-gpu && ctest -L gpu -E test_nccl -j 2 --timeout 150 --output-on-failure"
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Not Run" "$OUT/ctest_gpu.log" | head -12
for profile in "this_gpu 0 auto" "h200_mma 0 mma" "a100 163 mma" "rtx4090 99 mma"; do
  set -- $profile
  step "attention_$1" 60 build-gpu/benchmarks/bench_kernels --benchmark_filter='BM_Attention(Forward|Backward)/(4096|8192)' \
    --benchmark_color=false --shared_memory_limit_kib "$2" --attention_kernel "$3"
done
data=/tmp/gpus4096.jsonl
python3 - "$data" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(96): f.write(json.dumps({"input_ids": [random.randrange(151552) for _ in range(4096)]}) + "\n")
PY
train() {  # train NAME GA STEPS EXTRA...
  local name=$1 ga=$2 steps=$3; shift 3
  step "$name" 120 mpirun -np 1 --bind-to none build-gpu/glm_hpc --device cuda --config configs/glm4-9b-chat.cfg \
    --num_hidden_layers 4 --dataset "$data" --max_length 4096 --zero_stage 1 --gradient_accumulation_steps "$ga" \
    --max_steps "$steps" --logging_steps 1 --warmup_steps 0 --save_strategy no --overwrite_output_dir true \
    --output_dir "/tmp/$name" "$@"
}
train train_this_gpu 1 5
train train_a100 1 5 --attention_kernel mma --shared_memory_limit_kib 163
train train_rtx4090 1 5 --attention_kernel mma --shared_memory_limit_kib 99
train gpu_ga16 16 3
train offload_ga16 16 3 --offload_optimizer cpu
step_table
echo "== cuda architectures in build-gpu/glm_hpc =="; cat "$OUT/archs.log"
echo "== attention (ms; bench_kernels) =="
for f in "$OUT"/attention_*.log; do echo "$(basename "$f" .log): $(grep -E "^BM_Attention" "$f" | awk '{printf "%s %s %s; ", $1, $2, $3}')"; done
echo "== start lines =="
for name in train_this_gpu train_a100 train_rtx4090; do grep -m1 -o "cuda (.*)" "$OUT/$name.log"; done
python3 - <<'PY'
import json
print("\n== GLM-4-9B shapes, 4 layers, seq 4096, ZeRO-1, 1 x H200 ==")
rate = {}
for name in ("train_this_gpu", "train_a100", "train_rtx4090", "gpu_ga16", "offload_ga16"):
    try:
        r = [json.loads(l) for l in open(f"/tmp/{name}/logging.jsonl") if '"loss"' in l][1:]
        rate[name] = sum(x["tokens_per_second"] for x in r) / len(r)
        print("%-15s %8.0f tokens/s over %d steps, loss %.5f -> %.5f, %.1f GiB" % (name, rate[name], len(r), r[0]["loss"], r[-1]["loss"], max(x.get("device_memory_gib", 0) for x in r)))
    except Exception as e: print(name, "no result:", e)
if "gpu_ga16" in rate and "offload_ga16" in rate:
    print("offloaded optimizer at accumulation 16: %.2f of the GPU optimizer's tokens/s (target >= 0.70)" % (rate["offload_ga16"] / rate["gpu_ga16"]))
PY
