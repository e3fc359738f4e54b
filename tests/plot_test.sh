#!/usr/bin/env bash
# ctest plot_charts: the charts of training runs, opened and checked by plot_check.py.
# 1. A tiny run with evaluation draws its PNG charts at the end (OUTPUT_DIR/images).
# 2. glm_hpc plot overlays it with a second run (each run's colour drawn in the loss chart).
# 3. --plot_format svg, and gnuplot missing from PATH: SVG charts holding every logged step.
#    A run replacing another removes its charts, not the user's files beside them.
# 4. Bad input: no directory, a directory without logging.jsonl, a torn record mid-file: exit 2 with
#    the reason; a torn last record (a killed run) is skipped.
# Usage: plot_test.sh GLM_HPC_BINARY
set -euo pipefail
binary=$(realpath "$1")
here=$(cd "$(dirname "$0")/.." && pwd)
check="/usr/bin/python3 $here/tests/plot_check.py"
out=$(mktemp -d "${TMPDIR:-/tmp}/glm_plot.XXXXXX")
trap 'rm -rf "$out"' EXIT
common=(--max_length 128 --logging_steps 1 --eval_steps 4 --split_dataset_ratio 0.05 --save_strategy no
  --report_to none --max_steps 8)
charts=train_loss,eval_loss,eval_token_acc,train_learning_rate,train_grad_norm,train_tokens_per_second,train_memory
have_gnuplot=0
command -v gnuplot >/dev/null && have_gnuplot=1

"$binary" "${common[@]}" --output_dir "$out/a" >"$out/a.log"
# b: a constant learning rate (a flat line: a chart whose values do not vary).
"$binary" "${common[@]}" --learning_rate 5e-3 --lr_scheduler_type constant --warmup_ratio 0 --output_dir "$out/b" \
  >"$out/b.log"
if [ $have_gnuplot = 1 ]; then
  grep -q "plots (gnuplot" "$out/a.log" || { cat "$out/a.log"; echo "the run did not draw its charts"; exit 1; }
  $check "$out/a/images" --expect "$charts" --absent train_mfu
  "$binary" plot "$out/a" "$out/b" --save_dir "$out/both" >"$out/both.log"
  $check "$out/both" --expect train_loss --runs 2
else
  grep -q "plots (svg; gnuplot is not on PATH)" "$out/a.log"
fi

"$binary" plot "$out/a" "$out/b" --plot_format svg --save_dir "$out/svg" >"$out/svg.log"
$check "$out/svg" --expect "$charts" --svg "$out/a" "$out/b"
# Without gnuplot on PATH (a PATH of links to every program but gnuplot; MPI needs its own): SVG,
# and the reason said.
mkdir "$out/no_gnuplot_path"
IFS=: read -ra path_dirs <<<"$PATH"
for d in "${path_dirs[@]}"; do  # one ln a directory; a name already linked keeps its first
  [ -d "$d" ] && ln -s "$d"/* "$out/no_gnuplot_path/" 2>/dev/null || true
done
rm -f "$out/no_gnuplot_path/gnuplot"
PATH="$out/no_gnuplot_path" "$binary" plot "$out/b" --save_dir "$out/nognuplot" >"$out/nognuplot.log"
grep -q "plots (svg; gnuplot is not on PATH)" "$out/nognuplot.log" || { cat "$out/nognuplot.log"; exit 1; }
$check "$out/nognuplot" --expect train_loss,eval_loss,train_learning_rate --svg "$out/b"

# A run replacing a (--overwrite_output_dir) removes a's charts with its log, not the user's files.
echo "notes" >"$out/a/images/mine.txt"
"$binary" --max_length 128 --max_steps 3 --save_strategy no --report_to none --overwrite_output_dir true \
  --plot_format none --output_dir "$out/a" >"$out/a2.log"
test -f "$out/a/images/mine.txt" || { echo "a file of the user's in images/ was removed"; exit 1; }
if ls "$out/a/images/"*.png "$out/a/images/"*.svg 2>/dev/null; then echo "the replaced run's charts stayed"; exit 1; fi

expect_refusal() {  # expect_refusal PATTERN ARGS...: exit code 2 and PATTERN on stderr
  local pattern=$1
  shift
  set +e
  "$binary" "$@" >"$out/refused.out" 2>"$out/refused.err"
  local code=$?
  set -e
  [ $code = 2 ] || { cat "$out/refused.err"; echo "exit code $code for $*, expected 2"; exit 1; }
  grep -q "$pattern" "$out/refused.err" || { cat "$out/refused.err"; echo "no '$pattern' for $*"; exit 1; }
}
expect_refusal "give the output directory of one or more training runs" plot
expect_refusal "is not a directory" plot "$out/missing"
mkdir "$out/empty"
expect_refusal "has no readable logging.jsonl" plot "$out/empty"
mkdir "$out/torn"
{ head -n 3 "$out/b/logging.jsonl"; echo '{"step": 4, "loss": 1.2'; tail -n +4 "$out/b/logging.jsonl"; } \
  >"$out/torn/logging.jsonl"
expect_refusal "logging.jsonl:4: not a logging.jsonl record" plot "$out/torn"
{ cat "$out/b/logging.jsonl"; printf '{"step": 9, "lo'; } >"$out/torn/logging.jsonl"
"$binary" plot "$out/torn" --plot_format svg >/dev/null
expect_refusal "must be in \[0, 1)" plot "$out/a" --plot_smoothing 1
expect_refusal "unrecognised\|too many positional\|unexpected" train "$out/a"
echo "plot_test: all checks passed"
