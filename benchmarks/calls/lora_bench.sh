#!/usr/bin/env bash
# Issue 10's benchmark on one H200, one call: glm_hpc --train_type lora on GLM-4-9B-Chat shapes
# (random init), seq 8192, micro-batch 1, rank 8 on every linear, with each recompute policy
# (GLM_LORA_RECOMPUTE, default "none full"), then the transformers + PEFT peer
# (benchmarks/peers/hf_glm_lora_peer.py) without and with gradient checkpointing, in the same call.
# Expects build-gpu/glm_hpc (benchmarks/calls/gpu_session.sh with GLM_ONLY_BUILD=1 builds it).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
SEQ=${GLM_LORA_SEQ:-8192}
# GLM_LORA_PROMPT_FRACTION (default 0): the first fraction of each row is prompt (labels -100), for
# ours and the peer alike.
FRACTION=${GLM_LORA_PROMPT_FRACTION:-0}
python3 - "$SEQ" "$FRACTION" <<'PY'
import json, random, sys
seq, prompt = int(sys.argv[1]), int(float(sys.argv[2]) * int(sys.argv[1]))
random.seed(0)
with open(f"/tmp/bench{seq}.jsonl", "w") as f:
    for _ in range(16):
        ids = [random.randrange(151552) for _ in range(seq)]
        row = {"input_ids": ids}
        if prompt > 0:
            row["labels"] = [-100] * prompt + ids[prompt:]
        f.write(json.dumps(row) + "\n")
PY
for policy in ${GLM_LORA_RECOMPUTE:-none full}; do
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/lora_mem_$policy.csv" 2>/dev/null &
  smi=$!
  mpirun --allow-run-as-root -np 1 --bind-to none build-gpu/glm_hpc --device cuda --config configs/glm4-9b-chat.cfg \
    --train_type lora --lora_rank 8 --lora_alpha 32 --target_modules all-linear ${GLM_LORA_ARGS:-} \
    --dataset /tmp/bench$SEQ.jsonl --max_length "$SEQ" --per_device_train_batch_size 1 --gradient_accumulation_steps 1 \
    --max_steps 7 --logging_steps 1 --warmup_steps 0 --recompute "$policy" --save_strategy no \
    --overwrite_output_dir true --output_dir /tmp/lora_$policy >"$OUT/lora_$policy.log" 2>&1 || { echo "lora $policy failed"; tail -8 "$OUT/lora_$policy.log"; }
  kill $smi 2>/dev/null
  python3 - "$policy" "$SEQ" "$OUT/lora_mem_$policy.csv" <<'PY'
import json, sys
policy, seq, mem = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    recs = [json.loads(l) for l in open(f"/tmp/lora_{policy}/logging.jsonl")]
except OSError:
    sys.exit(0)
steady = recs[2:]
tps = sum(r["tokens_per_second"] for r in steady) / max(len(steady), 1)
n_mm = 40 * 203948032 + 620756992
flops = 4 * n_mm + 6 * 40 * 4096 * seq
peak = max([int(x) for x in open(mem).read().split() if x.strip().isdigit()] or [0]) / 1024
print(f"ours lora recompute {policy}: {tps:.0f} tokens/s, {tps * flops / 1e12:.1f} TFLOP/s, "
      f"MFU {100 * tps * flops / 989e12:.1f}%, peak {peak:.1f} GiB (nvidia-smi), loss {recs[0]['loss']:.4f} -> {recs[-1]['loss']:.4f}")
PY
done
[ "${GLM_SKIP_PEERS:-0}" = 1 ] || timeout 480 python3 benchmarks/peers/hf_glm_lora_peer.py --seq "$SEQ" --prompt_fraction "$FRACTION" ${GLM_LORA_PEER_ARGS:-} 2>"$OUT/lora_peer.err" ||
  tail -5 "$OUT/lora_peer.err"
