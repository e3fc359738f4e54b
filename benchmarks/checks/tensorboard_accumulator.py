#!/usr/bin/env python3
"""A run's TensorBoard event files read by TensorBoard itself (EventAccumulator, the reader behind
its dashboard), every scalar compared with logging.jsonl: each number of each record one scalar at
its step (train/<key>, eval/<rest> for eval_<rest>; the per-rank gpu_* arrays as <tag>/rank<r> up to
16 ranks, <tag>/min and /max beyond), equal as float32, one value per (tag, step), and the run's
options on the text dashboard. Prints one line; exit 1 on the first difference.
Usage: tensorboard_accumulator.py OUTPUT_DIR"""
import glob
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from tensorboard_check import expected_scalars  # noqa: E402  the same mapping CI checks


def main(out_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    files = glob.glob(os.path.join(out_dir, "runs", "**", "events.out.tfevents.*"), recursive=True)
    if not files:
        sys.exit(f"no event files under {out_dir}/runs")
    got = {}
    texts = set()
    for run_dir in sorted({os.path.dirname(f) for f in files}):
        ea = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
        ea.Reload()
        tags = ea.Tags()
        for tag in tags.get("scalars", []):
            for e in ea.Scalars(tag):
                if (tag, e.step) in got:
                    sys.exit(f"{tag} step {e.step} appears twice")
                got[(tag, e.step)] = e.value
        texts.update(tags.get("tensors", []))
    want = expected_scalars(out_dir)
    if set(want) != set(got):
        diff = sorted(set(want) ^ set(got))[:10]
        sys.exit(f"tags/steps differ between logging.jsonl and TensorBoard: {diff}")
    for key, value in want.items():
        f32 = struct.unpack("<f", struct.pack("<f", value))[0]
        if not (got[key] == f32 or math.isclose(got[key], f32, rel_tol=1e-6)):
            sys.exit(f"{key}: TensorBoard {got[key]} vs logging.jsonl {value}")
    if not any(t.startswith("args") for t in texts):
        sys.exit(f"no args text in TensorBoard (tensor tags: {sorted(texts)[:5]})")
    gpu_tags = sorted({t for (t, _) in got if t.startswith("train/gpu_")})
    steps = sorted({s for (_, s) in got})
    print(f"EventAccumulator: {len(got)} scalars, {len({t for (t, _) in got})} tags over steps {steps[0]}..{steps[-1]} "
          f"equal to logging.jsonl; GPU tags: {', '.join(gpu_tags) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1])
