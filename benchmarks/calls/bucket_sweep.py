#!/usr/bin/env python3
"""Trainer bucket-size sweep: runs glm_hpc for a few steps per setting over --reduce_bucket_size
(bucket bytes converted to elements of --grad_reduce_dtype), ZeRO stages and --overlap_comm on/off;
reads step time, exposed communication and peak device memory from each run's logging.jsonl (and
the communication-buffer bytes from its start-up line).

Every setting runs --repeats times, in rounds that visit the settings in turn (a drift of the
machine spreads over all of them), and more rounds follow, up to --max_repeats, while some
setting's 95% confidence interval of the mean step time is wider than --target_ci of its mean.
The best setting is the lowest mean; every setting whose difference from it is within the two
intervals combined is marked "within noise" of it: those are equally good as far as the sweep can
tell. Writes bucket_sweep.csv (means, intervals, the mark), a PNG with error bars by gnuplot when
it is installed (else matplotlib: the GPU machines' image has it, not gnuplot), and prints the best
setting with the ones within its noise.

CPU (CI, a tiny model):
  python3 benchmarks/calls/bucket_sweep.py --binary build/glm_hpc --np 2 --device cpu \
      --bucket_bytes 16K,4M --stages 1,3 --steps 2 --out /tmp/sweep -- --hidden_size 64 --max_length 128
GPU (GLM-4-9B-Chat shapes, 2 x H200; see the script's --help and the report in RESULTS.md):
  python3 benchmarks/calls/bucket_sweep.py --binary build-gpu/glm_hpc --np 2 --device cuda \
      --bucket_bytes 4M,16M,64M,256M,1G --stages 1,2,3 --steps 6 --skip_steps 2 --out $OUT/sweep -- \
      --config configs/glm4-9b-chat.cfg --dataset /tmp/bench9b.jsonl --max_length 4096 \
      --per_device_train_batch_size 1 --collective_timeout 120

Only the standard library (and matplotlib, for the PNG where gnuplot is missing). Exit status: 0 when
every setting ran and logged its steps, 1 otherwise.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}
COLUMNS = ["stage", "overlap_comm", "bucket_bytes", "reduce_bucket_size", "grad_reduce_dtype", "runs", "steps_timed",
           "step_seconds", "step_seconds_ci95", "exposed_comm_seconds", "exposed_comm_pct", "tokens_per_second",
           "peak_memory_gib", "comm_buffers_mib", "within_noise_of_best", "status"]
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); beyond, the normal's 1.96.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci95(values):
    """Mean and the half-width of its 95% confidence interval (Student t); inf for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("inf")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, (T95[n - 2] if n - 1 <= len(T95) else 1.96) * (var / n) ** 0.5


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (bytes, or K/M/G suffix)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def show_bytes(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--binary", required=True, help="the glm_hpc executable")
    p.add_argument("--np", type=int, default=2, help="ranks (one per GPU with --device cuda)")
    p.add_argument("--mpirun", default="mpirun", help="MPI launcher")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--bucket_bytes", default="4M,16M,64M,256M,1G",
                   help="comma-separated bucket sizes in bytes of the reduce dtype (K/M/G suffixes)")
    p.add_argument("--stages", default="1,2,3", help="comma-separated ZeRO stages")
    p.add_argument("--overlap", default="true,false", help="comma-separated --overlap_comm values")
    p.add_argument("--grad_reduce_dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs of every setting at least")
    p.add_argument("--max_repeats", type=int, default=6, help="runs of a setting at most")
    p.add_argument("--target_ci", type=float, default=0.02,
                   help="more rounds while a setting's 95%% interval is wider than this fraction of its mean")
    p.add_argument("--skip_steps", type=int, default=1, help="first steps left out of the averages (warm-up)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run before it counts as failed")
    p.add_argument("--out", required=True, help="directory for the runs, bucket_sweep.csv and bucket_sweep.png")
    p.add_argument("trainer_args", nargs="*", help="after --: further glm_hpc options (model, data, batch)")
    a = p.parse_args(argv)
    try:
        a.bucket_bytes = [parse_bytes(t) for t in a.bucket_bytes.split(",") if t.strip()]
        a.stages = [int(s) for s in a.stages.split(",") if s.strip()]
        a.overlap = [o.strip() for o in a.overlap.split(",") if o.strip()]
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    if not a.bucket_bytes or not a.stages or not a.overlap:
        p.error("--bucket_bytes, --stages and --overlap need at least one value each")
    if any(s not in (0, 1, 2, 3) for s in a.stages):
        p.error("--stages takes ZeRO stages 0-3")
    if any(o not in ("true", "false") for o in a.overlap):
        p.error("--overlap takes true and/or false")
    if a.repeats < 1 or a.max_repeats < a.repeats:
        p.error("--repeats must be >= 1 and --max_repeats >= --repeats")
    if a.steps <= a.skip_steps:
        p.error(f"--steps ({a.steps}) must exceed --skip_steps ({a.skip_steps})")
    if not os.access(a.binary, os.X_OK):
        p.error(f"--binary {a.binary} is not an executable")
    return a


def run_once(a, stage, overlap, bucket_bytes, repeat):
    """One run of a setting: a row with this run's means, status "ok" or why not."""
    elem = 2 if a.grad_reduce_dtype == "bf16" else 4
    elements = max(1, bucket_bytes // elem)
    name = f"zero{stage}_overlap-{overlap}_{bucket_bytes}B_run{repeat}"
    out_dir = os.path.join(a.out, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [a.mpirun, "--oversubscribe", "-np", str(a.np), "--bind-to", "none", a.binary, "--device", a.device,
           *a.trainer_args, "--max_steps", str(a.steps), "--logging_steps", "1", "--warmup_steps", "0",
           "--save_strategy", "no", "--eval_steps", "0", "--output_dir", out_dir, "--zero_stage", str(stage),
           "--overlap_comm", overlap, "--reduce_bucket_size", str(elements), "--allgather_bucket_size",
           str(elements), "--grad_reduce_dtype", a.grad_reduce_dtype]
    row = {"stage": stage, "overlap_comm": overlap, "bucket_bytes": bucket_bytes, "reduce_bucket_size": elements,
           "grad_reduce_dtype": a.grad_reduce_dtype}
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, name + ".log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.monotonic() - start
    text = open(log_path, errors="replace").read()
    m = re.search(r"memory per rank \(ZeRO-\d\), ranks? 0[-,\d]* of \d+: .*communication buffers ([\d.]+) MiB", text)
    row["comm_buffers_mib"] = m.group(1) if m else ""
    records = []
    try:
        with open(os.path.join(out_dir, "logging.jsonl")) as f:
            records = [r for r in (json.loads(line) for line in f if line.strip()) if "step_seconds" in r]
    except (OSError, ValueError):
        pass
    timed = records[a.skip_steps:]
    if rc != 0 or len(records) != a.steps:
        tail = " | ".join(text.strip().splitlines()[-3:])
        row["status"] = f"failed (exit {rc}, {len(records)} of {a.steps} steps logged; see {log_path}: {tail})"
        print(f"  {name}: {row['status']}", flush=True)
        return row
    step = sum(r["step_seconds"] for r in timed) / len(timed)
    exposed = sum(r["exposed_comm_seconds"] for r in timed) / len(timed)
    memory = [r["device_memory_gib"] for r in records if "device_memory_gib" in r]
    row.update({"steps_timed": len(timed), "step_seconds": f"{step:.6f}", "exposed_comm_seconds": f"{exposed:.6f}",
                "exposed_comm_pct": f"{100 * exposed / step:.2f}" if step > 0 else "",
                "tokens_per_second": f"{sum(r['tokens_per_second'] for r in timed) / len(timed):.1f}",
                "peak_memory_gib": f"{max(memory):.2f}" if memory else "", "status": "ok"})
    print(f"  {name}: step {step:.4f} s, exposed comm {row['exposed_comm_pct']}%, "
          f"peak {row['peak_memory_gib'] or 'n/a'} GiB, buffers {row['comm_buffers_mib']} MiB ({wall:.1f} s)",
          flush=True)
    return row


def combine(runs):
    """A setting's row from its runs: means over the runs, the step time's 95% interval."""
    row = dict(runs[0])
    ok = [r for r in runs if r["status"] == "ok"]
    row["runs"] = len(ok)
    if len(ok) < len(runs):
        row["status"] = next(r["status"] for r in runs if r["status"] != "ok")
        return row
    steps = [float(r["step_seconds"]) for r in ok]
    mean, ci = mean_ci95(steps)
    exposed = sum(float(r["exposed_comm_seconds"]) for r in ok) / len(ok)
    row.update({"steps_timed": sum(int(r["steps_timed"]) for r in ok), "step_seconds": f"{mean:.6f}",
                "step_seconds_ci95": f"{ci:.6f}" if ci != float("inf") else "",
                "exposed_comm_seconds": f"{exposed:.6f}",
                "exposed_comm_pct": f"{100 * exposed / mean:.2f}" if mean > 0 else "",
                "tokens_per_second": f"{sum(float(r['tokens_per_second']) for r in ok) / len(ok):.1f}",
                "peak_memory_gib": max((r["peak_memory_gib"] for r in ok), key=lambda v: float(v or 0)),
                "status": "ok"})
    return row


def ci_of(row):
    return float(row["step_seconds_ci95"]) if row.get("step_seconds_ci95") else float("inf")


def measure(a, settings):
    """Rounds over the settings until every interval is narrow enough or max_repeats is reached."""
    runs = {s: [] for s in settings}
    for repeat in range(1, a.max_repeats + 1):
        todo = settings
        if repeat > a.repeats:
            todo = [s for s in settings if all(r["status"] == "ok" for r in runs[s])
                    and ci_of(combine(runs[s])) > a.target_ci * float(combine(runs[s])["step_seconds"])]
            if not todo:
                break
            print(f"round {repeat}: {len(todo)} setting(s) with a 95% interval over {100 * a.target_ci:g}% "
                  "of their mean", flush=True)
        for s in todo:
            if runs[s] and runs[s][-1]["status"] != "ok":
                continue  # a failed setting is not run again
            runs[s].append(run_once(a, *s, repeat))
    return [combine(runs[s]) for s in settings]


def mark_noise(rows):
    """The best (lowest mean) row, and within_noise_of_best on every successful row."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    best = min(ok, key=lambda r: float(r["step_seconds"]))
    for r in ok:
        gap = float(r["step_seconds"]) - float(best["step_seconds"])
        noise = (ci_of(r) ** 2 + ci_of(best) ** 2) ** 0.5
        if noise == float("inf"):
            r["within_noise_of_best"] = "unknown (one run)"
        else:
            r["within_noise_of_best"] = "yes" if gap <= noise else "no"
    return best


def describe(r, a):
    ci = f" +- {float(r['step_seconds_ci95']):.4f}" if r.get("step_seconds_ci95") else ""
    return (f"ZeRO-{r['stage']} --overlap_comm {r['overlap_comm']} --reduce_bucket_size {r['reduce_bucket_size']} "
            f"({show_bytes(r['bucket_bytes'])} of {a.grad_reduce_dtype}): step {float(r['step_seconds']):.4f}{ci} s "
            f"over {r['runs']} run(s), exposed comm {r['exposed_comm_pct']}%")


def plot(a, rows, csv_path):
    png = os.path.join(a.out, "bucket_sweep.png")
    # One series per (stage, overlap), bucket size on a log axis.
    series = []
    for stage in a.stages:
        for overlap in a.overlap:
            pts = sorted((r["bucket_bytes"] / (1 << 20), float(r["step_seconds"]),
                          ci_of(r) if ci_of(r) != float("inf") else 0.0) for r in rows
                         if r["status"] == "ok" and r["stage"] == stage and r["overlap_comm"] == overlap)
            if pts:
                series.append((f"ZeRO-{stage} overlap {overlap}", pts))
    if not series:
        print("no successful run to plot")
        return None
    title = f"glm_hpc bucket sweep, {a.np} ranks, --device {a.device} (mean and 95% interval)"
    xlabel = f"reduce bucket size ({a.grad_reduce_dtype})"
    # One labelled tic per swept size, written as a size: a log axis's own tics crowd and say little.
    tics = [(show_bytes(b), b / (1 << 20)) for b in sorted(set(a.bucket_bytes))]
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        return plot_matplotlib(series, title, xlabel, tics, png)
    data_path = os.path.join(a.out, "bucket_sweep.dat")
    with open(data_path, "w") as f:
        for _, pts in series:
            f.write("".join(f"{b} {s} {e}\n" for b, s, e in pts) + "\n\n")
    plots = ", ".join(f"'{data_path}' index {i} using 1:2:3 with yerrorlines title '{t}'"
                      for i, (t, _) in enumerate(series))
    xtics = ", ".join(f'"{label}" {x}' for label, x in tics)
    script = (f"set terminal pngcairo size 1000,600 noenhanced; set output '{png}';"
              f"set logscale x 2; set xrange [{tics[0][1] / 1.6}:{tics[-1][1] * 1.6}]; set offsets 0, 0, graph 0.05, graph 0.05;"
              f"set xtics ({xtics}) rotate by -30; set xlabel '{xlabel}';"
              f"set ylabel 'step time (s)'; set key outside right; set grid;"
              f"set title '{title}'; plot {plots}")
    r = subprocess.run([gnuplot, "-e", script], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(png):
        # pngcairo is missing from some builds: the plain png terminal then.
        r = subprocess.run([gnuplot, "-e", script.replace("pngcairo", "png")], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(png):
        print(f"gnuplot failed ({r.stderr.strip()}): no PNG; the CSV has every number")
        return None
    return png


def plot_matplotlib(series, title, xlabel, tics, png):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the GPU machines
        import matplotlib.pyplot as plt
    except ImportError:
        print("neither gnuplot nor matplotlib found: no PNG (scripts/setup.sh installs gnuplot-nox); "
              "the CSV has every number")
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    for label, pts in series:
        ax.errorbar([b for b, _, _ in pts], [s for _, s, _ in pts], yerr=[e for _, _, e in pts], marker="o",
                    capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks([x for _, x in tics])
    ax.set_xticklabels([label for label, _ in tics], rotation=30, ha="right")
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("step time (s)")
    ax.set_title(title)
    ax.grid(True)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return png if os.path.exists(png) else None


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    settings = [(s, o, b) for s in a.stages for o in a.overlap for b in a.bucket_bytes]
    print(f"bucket sweep: {len(settings)} settings x {a.steps} steps, {a.repeats}-{a.max_repeats} runs each, on "
          f"{a.np} ranks (--device {a.device})", flush=True)
    rows = measure(a, settings)
    best = mark_noise(rows)
    csv_path = os.path.join(a.out, "bucket_sweep.csv")
    with open(csv_path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    os.replace(csv_path + ".tmp", csv_path)
    print(f"wrote {csv_path}")
    png = plot(a, rows, csv_path)
    if png:
        print(f"wrote {png}")
    ok = [r for r in rows if r["status"] == "ok"]
    if best is not None:
        print(f"best: {describe(best, a)}")
        same = [r for r in ok if r is not best and r["within_noise_of_best"] == "yes"]
        print(f"within its noise ({len(same)}): " + ("; ".join(describe(r, a) for r in same) if same else "none"))
        for stage in a.stages:
            mine = [r for r in ok if r["stage"] == stage]
            if mine:
                b = min(mine, key=lambda r: float(r["step_seconds"]))
                print(f"best at ZeRO-{stage}: {describe(b, a)}")
    failed = len(rows) - len(ok)
    if failed:
        print(f"{failed} of {len(rows)} settings failed (status column of {csv_path})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
