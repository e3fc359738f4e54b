#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with tools that are not glm_hpc's: every record's framing
and CRC32Cs (Debian's python3-crc32c where installed, else the reference bitwise CRC-32C, checked
on its standard value), every record decoded by `protoc --decode` against the schema, and compares
the scalars with logging.jsonl: each number of each record is one scalar at its step, tag
train/<key> or eval/<rest> for eval_<rest>, equal as float32, and no (tag, step) twice.
Usage: tensorboard_check.py OUTPUT_DIR PROTO_FILE"""
import glob
import json
import math
import os
import re
import struct
import subprocess
import sys

try:
    from crc32c import crc32c
except ImportError:
    def crc32c(data, crc=0):
        crc ^= 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        assert at + 12 <= len(data), f"{path}: a torn header at byte {at}"
        (length,) = struct.unpack_from("<Q", data, at)
        (length_crc,) = struct.unpack_from("<I", data, at + 8)
        assert length_crc == masked(crc32c(data[at:at + 8])), f"{path}: bad length CRC at byte {at}"
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        assert body_crc == masked(crc32c(body)), f"{path}: bad data CRC at byte {at}"
        yield body
        at += 16 + length


def decode(body, proto):
    out = subprocess.run(["protoc", "--decode=glm.tensorboard.Event", f"--proto_path={os.path.dirname(proto)}", proto],
                         input=body, capture_output=True, check=True)
    return out.stdout.decode()


RANK_TAGS = 16  # train/metrics_logger.h kTensorBoardRankTags


def expected_scalars(out_dir):
    """{(tag, step): value} that logging.jsonl implies: each number of each record at its step,
    train/<key> or eval/<rest> for eval_<rest>; the per-rank gpu_* arrays as <tag>/rank<r> up to
    RANK_TAGS ranks, <tag>/min and <tag>/max beyond."""
    expected = {}
    for line in open(os.path.join(out_dir, "logging.jsonl")):
        r = json.loads(line)
        for k, v in r.items():
            tag = "eval/" + k[5:] if k.startswith("eval_") else "train/" + k
            if k.startswith("gpu_") and isinstance(v, list):  # by rank: one tag a rank, or min and max
                numbers = [x for x in v if x is not None]
                if len(v) <= RANK_TAGS:
                    for rank, x in enumerate(v):
                        if x is not None:
                            expected[(f"{tag}/rank{rank}", r["step"])] = float(x)
                elif numbers:
                    expected[(tag + "/min", r["step"])] = float(min(numbers))
                    expected[(tag + "/max", r["step"])] = float(max(numbers))
                continue
            if k in ("step", "max_steps") or isinstance(v, (str, list, dict)) or v is None:
                continue
            expected[(tag, r["step"])] = float(v)
    return expected


def main(out_dir, proto):
    files = glob.glob(os.path.join(out_dir, "runs", "*.tfevents.*"))
    assert len(files) == 1, f"expected one event file, found {files}"
    scalars, texts, versions = {}, set(), 0
    for body in records(files[0]):
        text = decode(body, proto)
        if "file_version" in text:
            assert 'file_version: "brain.Event:2"' in text, text
            versions += 1
            continue
        step = int(re.search(r"^step: (\d+)", text, re.M).group(1)) if re.search(r"^step:", text, re.M) else 0
        tag = re.search(r'tag: "([^"]*)"', text).group(1)
        value = re.search(r"simple_value: (\S+)", text)
        if value is None:
            assert 'plugin_name: "text"' in text and "string_val:" in text, text
            texts.add(tag)
            continue
        key = (tag, step)
        assert key not in scalars, f"{key} written twice"
        scalars[key] = float(value.group(1))
    assert versions == 1, versions
    assert "args" in texts, texts
    expected = expected_scalars(out_dir)
    assert set(expected) == set(scalars), (sorted(set(expected) ^ set(scalars)))[:10]
    for key, want in expected.items():
        got = scalars[key]
        f32 = struct.unpack("<f", struct.pack("<f", want))[0]
        assert got == f32 or math.isclose(got, f32, rel_tol=1e-6), f"{key}: {got} vs {want}"
    steps = sorted({s for (_, s) in scalars})
    print(f"tensorboard_check: {len(scalars)} scalars over steps {steps[0]}..{steps[-1]}, every one in logging.jsonl")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
