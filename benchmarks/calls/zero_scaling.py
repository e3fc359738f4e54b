#!/usr/bin/env python3
"""Tables from the JSON rows benchmarks/calls/zero_x2.sh appends with GLM_ZERO_RESULTS (issues 11 and 12):
per sequence length and GPU count, each ZeRO stage's tokens/s per GPU, MFU, exposed communication
and peak memory, the FSDP2 peer measured beside it, and the scaling of tokens/s per GPU across GPU
counts for the same per-GPU batch: against the 2-GPU rows among the inputs, and against the 2 x H200
numbers recorded in benchmarks/RESULTS.md (--ref2). Rows from several calls or machines combine:

  python3 benchmarks/calls/zero_scaling.py zero_results_x4_1.jsonl zero_results_x8_2.jsonl --target 0.9

Only the standard library."""
import argparse
import json
import sys

# 2 x H200, GLM-4-9B-Chat shapes, seq 4096, micro-batch 1 per GPU (RESULTS.md, end of session 5:
# "+ 16-byte conversions and sum of squares"). ZeRO-2 was last measured two builds earlier (6,837):
# not comparable, so left out.
RESULTS_2GPU = "1:7785,3:7560"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSONL files of zero_x2.sh rows")
    p.add_argument("--ref2", default=RESULTS_2GPU, help="stage:tokens/s per GPU of 2 x H200 at seq 4096")
    p.add_argument("--target", type=float, default=0.95, help="scaling efficiency target (issue 11: 0.95, 12: 0.9)")
    a = p.parse_args(argv)
    ref2 = {int(k): float(v) for k, v in (x.split(":") for x in a.ref2.split(",") if x)}
    rows = []
    for path in a.results:
        try:
            rows += [json.loads(line) for line in open(path) if line.strip()]
        except OSError as e:
            print(f"skipping {path}: {e}")
    if not rows:
        print("no rows")
        return 1
    # The last row of each (seq, gpus, stage or peer) wins: a re-run replaces an earlier one.
    ours, peers, failed = {}, {}, {}
    for r in rows:
        peer = "peer" in r
        key = (r["seq"], r["gpus"], r["peer"]) if peer else (r["seq"], r["gpus"], r["stage"], r.get("recompute", "none"))
        for table in (ours, peers, failed):
            table.pop(key, None)
        (failed if r.get("status") != "ok" else peers if peer else ours)[key] = r

    for seq in sorted({k[0] for k in ours} | {k[0] for k in peers}):
        for gpus in sorted({k[1] for k in ours if k[0] == seq} | {k[1] for k in peers if k[0] == seq}):
            print(f"\n== GLM-4-9B-Chat shapes, seq {seq}, {gpus} x H200, micro-batch 1 per GPU ==")
            print(f"{'run':22s} {'tok/s/GPU':>10s} {'TFLOP/s/GPU':>12s} {'MFU':>6s} {'exposed':>8s} {'peak GiB (max GPU)':>19s}")
            best = 0.0
            for key in sorted(k for k in ours if k[:2] == (seq, gpus)):
                r = ours[key]
                best = max(best, r["tokens_per_second_per_gpu"])
                name = f"ZeRO-{r['stage']}" + ("" if r["recompute"] == "none" else f" {r['recompute']}")
                if r.get("launcher", "mpirun") != "mpirun":
                    name += " (slurm script)"
                peak = max(r["peak_gib"]) if r.get("peak_gib") else float("nan")
                print(f"{name:22s} {r['tokens_per_second_per_gpu']:10.0f} {r['tflops_per_gpu']:12.1f} "
                      f"{100 * r['mfu']:5.1f}% {100 * r['exposed_comm']:7.1f}% {peak:19.1f}")
            for key in sorted(k for k in peers if k[:2] == (seq, gpus)):
                r = peers[key]
                print(f"{'peer ' + r['peer']:22s} {r['tokens_per_second_per_gpu']:10.0f} {'':12s} {100 * r['mfu']:5.1f}%")
                if best:
                    print(f"{'  ours best / peer':22s} {best / r['tokens_per_second_per_gpu']:10.3f}x (target 1.3x)")

    print(f"\n== scaling: tokens/s per GPU against 2 GPUs, same per-GPU batch (target {100 * a.target:.0f}%) ==")
    print("1 GPU: full fine-tuning of GLM-4-9B does not fit one H200 (glm_hpc plan --world_size 1 at seq 4096: "
          "165-182 GiB for ZeRO 0-3 against 140.4 GiB), so 2 GPUs are the base")
    for seq in sorted({k[0] for k in ours}):
        counts = sorted({k[1] for k in ours if k[0] == seq})
        head = "".join(f"{str(g) + ' GPUs':>10s}" for g in counts)
        print(f"\nseq {seq}        {head}   efficiency vs 2 GPUs (this data) | vs RESULTS.md 2 x H200")
        for stage, recompute in sorted({(k[2], k[3]) for k in ours if k[0] == seq}):
            tps = {g: ours[(seq, g, stage, recompute)]["tokens_per_second_per_gpu"]
                   for g in counts if (seq, g, stage, recompute) in ours}
            cells = "".join(f"{tps[g]:10.0f}" if g in tps else f"{'-':>10s}" for g in counts)
            def eff(g, base):
                e = tps[g] / base
                return f"{g}: {100 * e:.1f}%" + ("" if e >= a.target else " (below)")
            here = [eff(g, tps[2]) for g in counts if g > 2 and g in tps and 2 in tps]
            ref = ref2.get(stage) if seq == 4096 and recompute == "none" else None
            there = [eff(g, ref) for g in counts if g > 2 and g in tps and ref]
            name = f"ZeRO-{stage}" + ("" if recompute == "none" else f" {recompute}")
            print(f"{name:15s} {cells}   {', '.join(here) or '-':24s} | "
                  f"{', '.join(there) if there else ('-' if seq != 4096 else 'no recent 2-GPU number in RESULTS.md')}")
    if failed:
        print("\nruns that failed: " + "; ".join(
            f"{r['gpus']} GPUs seq {r['seq']} " + (r.get("peer") or f"ZeRO-{r.get('stage')}") + f": {r['status']}"
            for r in failed.values()))
    print("\nfor orientation (other hardware and model, not a side-by-side): torchtitan Llama-3.1-8B, 8 x H100, "
          "FSDP2 bf16 seq 8192: 5,762 tok/s/GPU eager, 6,667 with torch.compile")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
