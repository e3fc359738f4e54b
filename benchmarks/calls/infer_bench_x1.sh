#!/usr/bin/env bash
# One call on one H200 for issue 32's speed checks: GLM-4-9B-Chat shapes (random bf16 weights written
# as a Hugging Face directory by transformers, no end token: every reply is max_new_tokens long),
# glm_hpc infer against transformers' generate (bf16, SDPA, static cache and torch.compile) on the
# same GPU in the same call:
#   - batch 1 and batch 32 decode: tokens/s, against the HBM roofline (the weights read per token
#     over the copy bandwidth bench_kernels measures here; target 80% at batch 1, 2x transformers),
#     with decode steps replayed as CUDA graphs (--cuda_graphs true) and op by op (false);
#     and batch 32 with every GEMM shape autotuned (--gemm_autotune all);
#   - prefill of a 32k-token prompt: seconds to the first token (target 1.3x transformers), cold
#     (the run's first forward) and warm (the same prompt again, as the peer times it);
# Then 100 chat prompts of data/sample end to end (batch mode, time to first token and tokens/s; the
# bundled tokenizer, whose ids fit the 9B vocabulary) and a batch-1 run under --profile (device time
# per op and the GPU's idle time). A short table comes last.
#   GLM_IB_NO_BUILD=1   use build-gpu as it is
#   GLM_IB_PEER=0       leave transformers out
#   GLM_IB_PEER_RUNS    the peer's runs, of "batch1 batch32 prefill" (default all three)
#   GLM_IB_TOKENS       new tokens a reply (default 256)
#   GLM_IB_PROFILE_BATCH=32  profile batch 32 instead of batch 1; =long: the 32k prompt's prefill
#   GLM_IB_NCU=1        also time every kernel of two batch-1 decode steps with Nsight Compute (op by
#                       op, --clock-control none) and print the time per kernel name for one token
#   GLM_IB_OLD=BINARY   also decode batch 1 and batch 32 and prefill 32k with another build's glm_hpc
#                       (an older tree's, built in the same call) and print new against old
#   GLM_IB_BEAMS=N      also beam search of N beams (no end token: every reply GLM_IB_BEAM_TOKENS long,
#                       default 128) at batch 1 and 8 (prompts of 512 tokens), with the best candidates
#                       chosen on the device, and at batch 8 through the host's whole rows (a
#                       repetition penalty of 1.0001 forces them), and beam sample at batch 8 (GLM-4's
#                       sampling, top_k 50); the peer: generate(num_beams=N)
#                       ("beam1 beam8" in GLM_IB_PEER_RUNS)
#   GLM_IB_KEEP=1       keep the work folder (build-gpu/infer_bench: the model, the logs of earlier
#                       calls) and reuse its model, so a later call on a warm machine can run the
#                       steps one call had no time for; STEP_ONLY names those steps (steps.sh)
#
# GLM_IB_DRY_RUN=1: the same steps on the CPU backend with build-cpu and a tiny model directory made
# by glm_hpc itself (train, export; no torch), short prompts and 16 new tokens: the check, where the
# code is built, that the script and every option it passes work.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source benchmarks/calls/steps.sh
dry=${GLM_IB_DRY_RUN:-0}
export STEP_DEADLINE=${STEP_DEADLINE:-$(($(date +%s) + 575))}
tokens=${GLM_IB_TOKENS:-256}
if [ "$dry" = 1 ]; then
  B=build-cpu device=cpu tokens=16 long=300 prompt=40 peer=0
else
  B=build-gpu device=cuda long=32768 prompt=512 peer=${GLM_IB_PEER:-1}
  [ "${GLM_IB_NO_BUILD:-0}" = 1 ] ||
    GLM_ONLY_BUILD=1 GLM_BUILD_TARGETS="glm_hpc bench_kernels" bash benchmarks/calls/gpu_session.sh || exit 1
fi
W=$B/infer_bench
[ "${GLM_IB_KEEP:-0}" = 1 ] || rm -rf "$W"
mkdir -p "$W"
keep() { cp "$OUT/$1.log" "$W/" 2>/dev/null; }  # the table reads a step's log from $W, whichever call ran it
if [ -f "$W/model/config.json" ]; then
  :
elif [ "$dry" = 1 ]; then
  step make_model 120 bash -c "$B/glm_hpc --max_steps 2 --save_steps 2 --output_dir $W/run >/dev/null &&
    $B/glm_hpc export --ckpt_dir $W/run --save_dir $W/model"
  echo '{"eos_token_id": []}' >"$W/model/generation_config.json"
else
  # A step runs in the background, where stdin is /dev/null: the program goes to a file first.
  cat >"$W/make_model.py" <<'PY'
import sys, json, torch
from transformers import GlmConfig, GlmForCausalLM
cfg = GlmConfig(vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
                num_attention_heads=32, num_key_value_heads=2, head_dim=128, partial_rotary_factor=0.5,
                rope_theta=5e6, rms_norm_eps=1.5625e-07, max_position_embeddings=131072, attention_bias=True,
                tie_word_embeddings=False, pad_token_id=None, eos_token_id=None)
torch.manual_seed(0)
with torch.device("cuda"):
    model = GlmForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
json.dump({"eos_token_id": [], "do_sample": False}, open(sys.argv[1] + "/generation_config.json", "w"))
PY
  step make_model 240 python3 "$W/make_model.py" "$W/model"
  cp data/sample/tokenizer.model "$W/model/"
fi
[ "$dry" = 1 ] || step copy_ceiling 120 $B/benchmarks/bench_kernels --benchmark_filter='BM_CeilingCopy' \
  --benchmark_format=json --benchmark_out="$W/copy.json"
python3 - "$W" "$prompt" "$long" <<'PY'
import json, random, sys
w, n, long_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(1)
for name, count, length in (("one", 1, n), ("batch", 32, n), ("long", 1, long_)):
    with open(f"{w}/{name}.jsonl", "w") as f:
        for _ in range(count):
            f.write(json.dumps({"input_ids": [random.randrange(1000, 150000 if n > 100 else 1400) for _ in range(length)]}) + "\n")
open(f"{w}/batch8.jsonl", "w").writelines(open(f"{w}/batch.jsonl").readlines()[:8])
for name in ("one", "long"):  # each prompt twice: the second reply runs warm
    line = open(f"{w}/{name}.jsonl").read()
    open(f"{w}/{name}_twice.jsonl", "w").write(line + line)
PY
head -100 data/sample/conversations.jsonl >"$W/chat.jsonl"
infer() {  # infer NAME FILE BATCH NEW_TOKENS [OPTION...]
  local name=$1 file=$2 batch=$3 new=$4; shift 4
  step "glm_$name" 240 mpirun -np 1 --bind-to none "${BIN:-$B/glm_hpc}" infer --device $device --model_id_or_path "$W/model" \
    --val_dataset "$W/$file.jsonl" --max_batch_size "$batch" --max_new_tokens "$new" --temperature "${TEMPERATURE:-0}" \
    --result_path "$W/result_$name.jsonl" "$@"
  keep "glm_$name"
}
infer batch1 one 1 "$tokens" --cuda_graphs true
# The same prompt twice: the second reply's numbers are warm (every kernel loaded, every GEMM shape's
# algorithm chosen), as the peer's, which times a second generate().
infer batch1_warm one_twice 1 "$tokens" --cuda_graphs true
infer batch32 batch 32 "$tokens" --cuda_graphs true
# The same decodes op by op (--cuda_graphs false): what replaying each step as a CUDA graph gains.
infer batch1_eager one 1 "$tokens" --cuda_graphs false
infer batch32_eager batch 32 "$tokens" --cuda_graphs false
# Batch 32's GEMMs (32 rows: cuBLASLt, not the few-row GEMV) with every shape's algorithm timed
# at its first call (--gemm_autotune all) instead of cuBLASLt's first heuristic.
infer batch32_tuned batch 32 "$tokens" --gemm_autotune all
infer prefill long 1 1
# The 32k prompt twice: the second prefill runs warm, as the peer's second generate() does.
infer prefill_warm long_twice 1 1
infer chat100 chat 32 "$tokens"
beams=${GLM_IB_BEAMS:-0} beam_tokens=${GLM_IB_BEAM_TOKENS:-128}
if [ "$beams" -gt 1 ]; then
  infer beam1 one_twice 1 "$beam_tokens" --num_beams "$beams"
  infer beam8 batch8 8 "$beam_tokens" --num_beams "$beams"
  infer beam8_host batch8 8 "$beam_tokens" --num_beams "$beams" --repetition_penalty 1.0001
  # Beam sample with GLM-4-9B-Chat's sampling (generation_config.json: temperature 0.8, top_p 0.8;
  # transformers' top_k 50): the rows' top 50 from the device.
  TEMPERATURE=0.8 infer beam8_sample batch8 8 "$beam_tokens" --num_beams "$beams" --top_p 0.8 --top_k 50
  TEMPERATURE=0.8 infer beam8_sample_host batch8 8 "$beam_tokens" --num_beams "$beams" --top_p 0.8 --top_k 50 \
    --repetition_penalty 1.0001
fi
if [ -n "${GLM_IB_OLD:-}" ]; then
  BIN=$GLM_IB_OLD infer old_batch1 one 1 "$tokens"
  BIN=$GLM_IB_OLD infer old_batch32 batch 32 "$tokens"
  BIN=$GLM_IB_OLD infer old_prefill long 1 1
  BIN=$GLM_IB_OLD infer old_prefill_warm long_twice 1 1
fi
# GLM_IB_PROFILE_BATCH=32: the profiled run decodes the 32 prompts instead of one; =long: it is the
# 32k prompt's prefill, twice (the second warm).
case "${GLM_IB_PROFILE_BATCH:-1}" in
  32) profiled="batch 32" ;;
  long) profiled="long_twice 1" ;;
  *) profiled="one 1" ;;
esac
# shellcheck disable=SC2086
[ "$dry" = 1 ] || infer profile $profiled 64 --profile true
if [ "${GLM_IB_NCU:-0}" = 1 ] && [ "$dry" != 1 ]; then
  # Prefill and the first steps take the first few thousand launches; two decode steps follow.
  step ncu_batch1 200 mpirun -np 1 --bind-to none ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum \
    --launch-skip 4000 --launch-count 1200 --csv --print-units base --log-file "$W/ncu_batch1.csv" $B/glm_hpc infer --device cuda \
    --model_id_or_path "$W/model" --val_dataset "$W/one.jsonl" --max_batch_size 1 --max_new_tokens 24 --temperature 0 \
    --cuda_graphs false --result_path "$W/result_ncu.jsonl"
  keep ncu_batch1
  python3 - "$W/ncu_batch1.csv" >"$OUT/ncu_table.txt" 2>&1 <<'PY'
import csv, collections, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
time, dram, count = collections.Counter(), collections.Counter(), collections.Counter()
ids = set()
for r in rows:
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("glm::cuda::", "").replace("void ", "")
    name = (name.split("(")[0][:34] + " " + r.get("Grid Size", "")).strip()  # a GEMV's grid names its matrix
    value = float(r["Metric Value"].replace(",", ""))  # base units: ns and bytes
    if r["Metric Name"] == "gpu__time_duration.sum":
        time[name] += value * 1e-3
        count[name] += 1
        ids.add(r["ID"])
    else:
        dram[name] += value
launches = len(ids)
total = sum(time.values())
print(f"{launches} kernels profiled, {total / 1e3:.2f} ms of kernel time in all")
print("%-48s %7s %10s %9s %9s" % ("kernel", "count", "us total", "us each", "GB/s"))
for name, t in time.most_common(25):
    print("%-48s %7d %10.1f %9.2f %9.0f" % (name, count[name], t, t / count[name], dram[name] / (t * 1e-6) / 1e9 if t else 0))
PY
  cat "$OUT/ncu_table.txt"
fi
if [ "$peer" = 1 ]; then
  cat >"$W/peer.py" <<'PY'
import json, sys, time, torch
from transformers import GlmForCausalLM
w, tokens, beams, beam_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
model = GlmForCausalLM.from_pretrained(f"{w}/model", dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
# With a static cache, generate() compiles the decoding forward itself (torch.compile, CUDA graphs);
# wrapping model.forward as well makes the graphs overwrite outputs generate still reads.
def rows(name):
    return [json.loads(l)["input_ids"] for l in open(f"{w}/{name}.jsonl")]
def run(ids, new, cache="static", **extra):
    x = torch.tensor(ids, device="cuda")
    kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, cache_implementation=cache,
              pad_token_id=0, eos_token_id=None, **extra)
    model.generate(x, **kw)  # compile and warm up at this shape
    print("warm", len(ids), new, flush=True)
    torch.cuda.synchronize(); t = time.time()
    out = model.generate(x, **kw)
    torch.cuda.synchronize()
    return time.time() - t, out.shape[1] - x.shape[1]
result = {}
for name, file, new in (("batch1", "one", tokens), ("batch32", "batch", tokens), ("prefill", "long", 1),
                        ("beam1", "one", beam_tokens), ("beam8", "batch8", beam_tokens)):
    if name not in sys.argv[3].split():
        continue
    beam = dict(num_beams=beams) if name.startswith("beam") else {}
    # Beam search reorders the cache every step: the static (compiled) cache and the dynamic one,
    # the faster counts.
    for cache in ("static", "dynamic") if beam else ("static",):
        try:
            secs, made = run(rows(file), new, cache, **beam)
            entry = result.setdefault(name, {})
            entry[cache + "_seconds"] = secs
            if "seconds" not in entry or secs < entry["seconds"]:
                entry.update(seconds=secs, tokens=made * len(rows(file)), cache=cache)
        except Exception as e:  # noqa: BLE001 - report and go on (out of memory at 32k, a compile failure)
            result.setdefault(name, {})[cache + "_error"] = repr(e)[:300]
            if "seconds" not in result[name]:
                result[name]["error"] = repr(e)[:300]
        print(name, cache, result[name], flush=True)
json.dump(result, open(f"{w}/peer.json", "w"))
PY
  step peer 420 python3 "$W/peer.py" "$W" "$tokens" "${GLM_IB_PEER_RUNS:-batch1 batch32 prefill}" \
    "${GLM_IB_BEAMS:-0}" "${GLM_IB_BEAM_TOKENS:-128}"
  keep peer
fi
python3 - "$W" "$OUT" "$tokens" "$dry" "${GLM_IB_BEAMS:-0}" <<'PY'
import json, re, sys
w, out, tokens, dry, beams = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
def glm(name):
    try:
        text = open(f"{w}/glm_{name}.log").read()
        m = re.search(r"infer: (\d+) replies, (\d+) tokens in ([0-9.e+-]+) s .*time to first token median ([0-9.e+-]+) s", text)
        return {"tokens": int(m.group(2)), "seconds": float(m.group(3)), "ttft": float(m.group(4))}
    except (OSError, AttributeError):
        return None
try:
    peer = json.load(open(f"{w}/peer.json"))
except OSError:
    peer = {}
def rows(name):  # the result file's rows: (response tokens, latency, time to first token)
    try:
        return [(r["response_tokens"], r["latency_s"], r["time_to_first_token_s"])
                for r in map(json.loads, open(f"{w}/result_{name}.jsonl"))]
    except (OSError, KeyError, ValueError):
        return []
def decode_rate(row):  # tokens a second after the first token: the decode steps alone
    made, latency, first = row
    return (made - 1) / (latency - first) if made > 1 and latency > first else 0
copy = None
try:
    runs = json.load(open(f"{w}/copy.json"))["benchmarks"]
    copy = max(b.get("GB/s", 0) for b in runs)
except (OSError, KeyError, ValueError):
    pass
weights = 8.78e9 * 2  # GLM-4-9B's parameters without the embedding table (one row a token), bf16
print(f"== glm_hpc infer, GLM-4-9B-Chat shapes, random weights, greedy, {tokens} new tokens ==")
print("%-9s %14s %14s %10s" % ("run", "glm_hpc tok/s", "peer tok/s", "ratio"))
for name in ("batch1", "batch32"):
    g, p = glm(name), peer.get(name, {})
    gt = g["tokens"] / g["seconds"] if g else 0
    pt = p["tokens"] / p["seconds"] if "seconds" in p else 0
    print("%-9s %14.1f %14.1f %10s" % (name, gt, pt, "%.2f" % (gt / pt) if pt else "-"))
    o = glm("old_" + name)
    if o and gt:
        ot = o["tokens"] / o["seconds"]
        print("          the older build (GLM_IB_OLD) %.1f tok/s: new / old %.3f" % (ot, gt / ot))
    t = glm(name + "_tuned")
    if t and gt:
        tt = t["tokens"] / t["seconds"]
        print("          every GEMM shape autotuned (--gemm_autotune all) %.1f tok/s: %.3fx" % (tt, tt / gt))
    e = glm(name + "_eager")
    if e and gt:
        et = e["tokens"] / e["seconds"]
        print("          op by op (--cuda_graphs false) %.1f tok/s: graphs %.2fx" % (et, gt / et))
    if name == "batch1" and copy and gt:
        roof = copy * 1e9 / weights
        print(f"          HBM roofline {roof:.1f} tok/s ({copy:.0f} GB/s copy, {weights / 1e9:.1f} GB a token): {gt / roof:.2f} of it")
        for label, run in (("", "batch1"), ("the older build's ", "old_batch1")):
            r = rows(run)
            if r and decode_rate(r[-1]):
                print(f"          {label}decode after the first token {decode_rate(r[-1]):.1f} tok/s: {decode_rate(r[-1]) / roof:.2f} of the roofline")
    warm = rows("batch1_warm") if name == "batch1" else []
    if len(warm) == 2:
        made, latency, first = warm[1]
        print("          warm (the second of two prompts, as the peer times it) %.1f tok/s%s; decode after the first token %.1f" %
              (made / latency, ", %.2fx the peer" % (made / latency / pt) if pt else "", decode_rate(warm[1])))
g, p = glm("prefill") or glm("prefill_warm"), peer.get("prefill", {})
if g:
    print("prefill   glm_hpc %.3f s to the first token%s" % (g["ttft"], "; peer %.3f s (%.2fx)" % (p["seconds"], p["seconds"] / g["ttft"]) if "seconds" in p else ""))
    o = glm("old_prefill")
    if o:
        print("          the older build (GLM_IB_OLD) %.3f s: old / new %.3f" % (o["ttft"], o["ttft"] / g["ttft"]))
    for label, run in (("", "prefill_warm"), ("the older build's ", "old_prefill_warm")):
        r = rows(run)
        if len(r) == 2:
            warm = r[1][2]
            print("          %swarm (the second of two, as the peer times it) %.3f s%s" %
                  (label, warm, "; peer %.2fx" % (p["seconds"] / warm) if "seconds" in p else ""))
g = glm("chat100")
if g:
    print("chat100   %d tokens in %.2f s: %.1f tok/s, time to first token median %.3f s" % (g["tokens"], g["seconds"], g["tokens"] / g["seconds"], g["ttft"]))
if beams > 1:
    print(f"== beam search of {beams} beams (tokens of the best reply a second) ==")
    r = rows("beam1")
    for name, label in (("beam1", "batch 1"), ("beam8", "batch 8")):
        p = peer.get(name, {})
        pt = p["tokens"] / p["seconds"] if "seconds" in p else 0
        if name == "beam1" and len(r) == 2:  # the second of the prompt twice: warm, as the peer times it
            gt = r[1][0] / r[1][1]
        else:
            g = glm(name)
            gt = g["tokens"] / g["seconds"] if g else 0
        other = "; the other cache %.1f s, this %.1f s" % tuple(p[c + "_seconds"] for c in (
            ("dynamic", "static") if p.get("cache") == "static" else ("static", "dynamic"))) if "static_seconds" in p and "dynamic_seconds" in p else ""
        print("%-9s glm_hpc %8.1f tok/s, peer %8.1f tok/s (%s cache%s)%s" % (label, gt, pt, p.get("cache", "-"), other,
              ": %.2fx" % (gt / pt) if pt and gt else (" " + p.get("error", "")[:120] if p else "")))
    g, h = glm("beam8"), glm("beam8_host")
    sample = glm("beam8_sample")
    if sample:
        st = sample["tokens"] / sample["seconds"]
        hs = glm("beam8_sample_host")
        print("batch 8 beam sample (temperature 0.8, top_p 0.8, top_k 50) %.1f tok/s%s" % (st,
              "; through whole rows on the host %.1f tok/s: %.2fx" % (hs["tokens"] / hs["seconds"], st / (hs["tokens"] / hs["seconds"])) if hs else ""))
    if g and h:
        print("batch 8 with whole logit rows on the host (repetition_penalty 1.0001) %.1f tok/s: the device's "
              "candidates %.2fx" % (h["tokens"] / h["seconds"], (g["tokens"] / g["seconds"]) / (h["tokens"] / h["seconds"])))
PY
[ -f "$W/glm_profile.log" ] && { echo "== ${profiled% *} under --profile =="; grep -v '^\[' "$W/glm_profile.log" | tail -40; }
echo "== steps =="
printf '%s\n' "${step_rows[@]}"
exit 0
