#!/usr/bin/env bash
# One call on one H200 for glm_hpc infer (issue 32): the KV cache's GPU test (test_cuda_ops
# CudaModel.CachedDecodingFollowsTheCpuBackend, with the gathered attention tests), then the CUDA
# backend against the CPU backend on the same checkpoint: a tiny model trained 40 steps on CUDA,
# the same prompt file answered greedily on each (replies agreeing, timings). GLM_INFER_FIXTURES=1
# also writes transformers' greedy continuations of the parity fixtures
# (tools/make_generate_fixtures.py, CPU fp32) into $OUT/fixtures for tests/data. A short table comes
# last. Builds glm_hpc and test_cuda_ops into build-gpu unless GLM_INFER_NO_BUILD=1 (a warm machine
# that has them).
#
# GLM_INFER_DRY_RUN=1 runs every step on the CPU backend with build-cpu (no transformers): the check,
# where the code is built, that the script and the options it passes work.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
dry=${GLM_INFER_DRY_RUN:-0}
source benchmarks/calls/steps.sh
if [ "$dry" = 1 ]; then
  B=build-cpu device=cpu
else
  B=build-gpu device=cuda
  fixtures_pid=
  if [ "${GLM_INFER_FIXTURES:-0}" = 1 ]; then
    step fixtures 240 python3 tools/make_generate_fixtures.py tests/data "$OUT/fixtures" &
    fixtures_pid=$!
  fi
  if [ "${GLM_INFER_NO_BUILD:-0}" != 1 ]; then
    GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc test_cuda_ops" bash benchmarks/calls/gpu_session.sh || exit 1
  fi
  step cuda_tests 240 build-gpu/tests/test_cuda_ops --gtest_brief=1 \
    --gtest_filter='Ops.DecodeAttention*:CudaModel.CachedDecoding*:*GatheredAttention*:CudaModel.TransformersParity*'
fi
W=/tmp/infer_call
rm -rf "$W" && mkdir -p "$W"
head -40 data/sample/conversations.jsonl >"$W/prompts.jsonl"
step train 120 mpirun -np 1 --bind-to none $B/glm_hpc --device "$device" --max_steps 40 --save_steps 40 \
  --logging_steps 10 --output_dir "$W/run"
for dev in $device cpu; do
  step "infer_$dev" 180 mpirun -np 1 --bind-to none $B/glm_hpc infer --device "$dev" --ckpt_dir "$W/run" \
    --val_dataset "$W/prompts.jsonl" --max_new_tokens 32 --result_path "$W/result_$dev.jsonl"
done
[ -n "${fixtures_pid:-}" ] && wait "$fixtures_pid"
python3 - "$W" "$device" "$OUT" <<'PY'
import json, sys
w, device = sys.argv[1], sys.argv[2]
def rows(dev):
    try:
        return [json.loads(l) for l in open(f"{w}/result_{dev}.jsonl")]
    except OSError:
        return []
a, b = rows(device), rows("cpu")
print(f"== infer: {len(a)} prompts, greedy, 32 new tokens at most, {device} against cpu ==")
same = sum(x.get("response") == y.get("response") for x, y in zip(a, b))
print(f"identical replies: {same} of {min(len(a), len(b))}")
for dev in (device, "cpu"):  # the run's own summary: requests overlap, so their latencies do not add up
    try:
        print(dev, [l.strip() for l in open(f"{sys.argv[3]}/infer_{dev}.log") if l.startswith("glm_hpc: infer:")][0])
    except (OSError, IndexError):
        print(dev, "no summary")
PY
echo "== steps =="
printf '%s\n' "${step_rows[@]}"
[ -f "$OUT/fixtures.log" ] && tail -3 "$OUT/fixtures.log"
[ -f "$OUT/cuda_tests.log" ] && grep -E "DecodeAttention|KV cache on CUDA|PASSED|FAILED|Failure" "$OUT/cuda_tests.log" | head -12
exit 0
