#!/usr/bin/env python3
"""Opens the charts glm_hpc plot wrote and checks they are real pictures of the runs.

PNG (read here with zlib alone: every chunk's CRC, IHDR, the filtered scanlines): the expected size,
not blank (many colours, a share of non-background pixels), and each run's colour present where
several runs overlay. SVG: well-formed XML whose polylines hold every logged step.
Usage: plot_check.py IMAGES_DIR --expect NAME[,NAME...] [--absent NAME,...] [--runs N] [--svg RUN_DIR...]
"""
import argparse
import json
import os
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

PALETTE = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28)]


def fail(msg):
    print(f"plot_check: {msg}", file=sys.stderr)
    sys.exit(1)


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG signature")
    pos, idat, ihdr, plte = 8, b"", None, None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            fail(f"{path}: chunk {kind!r} has a bad CRC")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            plte = [tuple(body[i:i + 3]) for i in range(0, len(body), 3)]
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    if ihdr is None:
        fail(f"{path}: no IHDR")
    width, height, depth, color, _, _, interlace = ihdr
    if depth != 8 or interlace != 0 or color not in (0, 2, 3, 4, 6):
        fail(f"{path}: unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                fail(f"{path}: row {y} has filter type {f}")
        rows.append(bytes(line))
        prev = line
    pixels = []
    for line in rows:
        for x in range(width):
            px = line[x * channels:(x + 1) * channels]
            if color == 3:
                pixels.append(plte[px[0]])
            elif color in (0, 4):
                pixels.append((px[0],) * 3)
            else:
                pixels.append(tuple(px[:3]))
    return width, height, pixels


def check_png(path, width, height, runs):
    w, h, pixels = read_png(path)
    if (w, h) != (width, height):
        fail(f"{path}: {w}x{h}, expected {width}x{height}")
    counts = {}
    for p in pixels:
        counts[p] = counts.get(p, 0) + 1
    background, most = max(counts.items(), key=lambda kv: kv[1])
    drawn = len(pixels) - most
    if len(counts) < 8 or drawn < 0.01 * len(pixels):
        fail(f"{path}: looks blank ({len(counts)} colours, {drawn} pixels off the background {background})")
    for r in range(runs):
        if counts.get(PALETTE[r], 0) < 20:
            fail(f"{path}: run {r}'s colour #{bytes(PALETTE[r]).hex()} is not drawn ({counts.get(PALETTE[r], 0)} px)")
    print(f"plot_check: {os.path.basename(path)} {w}x{h}, {len(counts)} colours, {100.0 * drawn / len(pixels):.1f}% drawn")


def logged_steps(run_dir, key):
    steps = []
    for line in open(os.path.join(run_dir, "logging.jsonl")):
        j = json.loads(line)
        if key in j and "skipped" not in j and isinstance(j[key], (int, float)):
            steps.append(j["step"])
    return steps


def check_svg(path, width, height, run_dirs, key):
    root = ET.parse(path).getroot()
    if root.get("width") != str(width) or root.get("height") != str(height):
        fail(f"{path}: size {root.get('width')}x{root.get('height')}, expected {width}x{height}")
    ns = "{http://www.w3.org/2000/svg}"
    lines = [p.get("points").split() for p in root.iter(ns + "polyline")]
    for run in run_dirs:
        n = len(logged_steps(run, key))
        if not any(len(points) == n for points in lines):
            fail(f"{path}: no polyline of {n} points ({key} of {run}); polylines: {[len(p) for p in lines]}")
    print(f"plot_check: {os.path.basename(path)} {len(lines)} polylines")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("images")
    ap.add_argument("--expect", required=True)
    ap.add_argument("--absent", default="")
    ap.add_argument("--runs", type=int, default=0, help="check that runs 0..N-1 have their colours drawn")
    ap.add_argument("--svg", nargs="*", default=None, help="the runs' directories: check SVG charts against them")
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--height", type=int, default=600)
    a = ap.parse_args()
    keys = {"train_loss": "loss", "eval_loss": "eval_loss", "train_learning_rate": "learning_rate",
            "train_grad_norm": "grad_norm", "train_tokens_per_second": "tokens_per_second",
            "eval_token_acc": "eval_token_acc", "train_memory": "host_memory_gib"}
    ext = ".svg" if a.svg is not None else ".png"
    for name in a.expect.split(","):
        path = os.path.join(a.images, name + ext)
        if not os.path.isfile(path):
            fail(f"{path} was not written (the directory holds {sorted(os.listdir(a.images))})")
        if a.svg is not None:
            check_svg(path, a.width, a.height, a.svg, keys[name])
        else:
            check_png(path, a.width, a.height, a.runs)
    for name in filter(None, a.absent.split(",")):
        for e in (".png", ".svg"):
            if os.path.exists(os.path.join(a.images, name + e)):
                fail(f"{name}{e} was written, but its runs have no such values")


if __name__ == "__main__":
    main()
