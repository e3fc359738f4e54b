#!/usr/bin/env bash
# ctest bucket_sweep_cpu: benchmarks/calls/bucket_sweep.py on 2 CPU ranks over a tiny model (2 bucket
# sizes x ZeRO 1, 3 x overlap on/off, 2 runs of 2 steps each). Asserts that the tools work: every
# setting ran twice, the CSV is complete with means, intervals and the within-noise mark, a best
# setting and those within its noise are printed, and the PNG exists when gnuplot does. Never
# asserts speed. Every tensor of this model is under DeepSpeed's default ZeRO-3
# persistence threshold, which would keep them all whole (no bucket-sized buffers to compare):
# --param_persistence_threshold 0 partitions them. Usage: bucket_sweep_test.sh GLM_HPC_BINARY MPIRUN
set -euo pipefail
binary=$1 mpirun=$2
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/glm_bucket_sweep.XXXXXX")
trap 'rm -rf "$out"' EXIT
cd "$here"
python3 benchmarks/calls/bucket_sweep.py --binary "$binary" --mpirun "$mpirun" --np 2 --device cpu \
  --bucket_bytes 16K,4M --stages 1,3 --overlap true,false --steps 2 --skip_steps 1 --repeats 2 --max_repeats 2 \
  --timeout 240 --out "$out" -- \
  --hidden_size 64 --intermediate_size 128 --max_length 128 --per_device_train_batch_size 2 \
  --param_persistence_threshold 0 | tee "$out/stdout"
grep -q "^best: ZeRO-[13] --overlap_comm \(true\|false\) --reduce_bucket_size [0-9].* over 2 run(s)" "$out/stdout"
grep -q "^within its noise ([0-9]*): " "$out/stdout"
python3 - "$out/bucket_sweep.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 8, f"{len(rows)} rows, expected 8"
seen = set()
for r in rows:
    assert r["status"] == "ok", r
    assert float(r["step_seconds"]) > 0 and float(r["exposed_comm_seconds"]) >= 0, r
    assert float(r["tokens_per_second"]) > 0 and int(r["steps_timed"]) == 2 and r["runs"] == "2", r
    assert float(r["step_seconds_ci95"]) >= 0 and r["within_noise_of_best"] in ("yes", "no"), r
    assert r["comm_buffers_mib"] != "", r
    elements = {"16384": "4096", "4194304": "1048576"}[r["bucket_bytes"]]  # fp32: 4 bytes an element
    assert r["reduce_bucket_size"] == elements, r
    seen.add((r["stage"], r["overlap_comm"], r["bucket_bytes"]))
assert len(seen) == 8, seen
assert sum(r["within_noise_of_best"] == "yes" for r in rows) >= 1, "the best is within its own noise"
# ZeRO-3 keeps bucket-sized gradient buffers: the 4 MiB bucket (the whole tiny model) needs more.
buf = {(r["stage"], r["bucket_bytes"]): float(r["comm_buffers_mib"]) for r in rows}
assert buf[("3", "4194304")] > buf[("3", "16384")], buf
print("bucket_sweep CSV complete:", len(rows), "settings")
PY
if command -v gnuplot >/dev/null; then
  test -s "$out/bucket_sweep.png" || { echo "gnuplot is installed but no PNG was written"; exit 1; }
else
  grep -q "wrote .*bucket_sweep.png\|neither gnuplot nor matplotlib" "$out/stdout"
fi
