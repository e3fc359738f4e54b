#!/usr/bin/env bash
# Encoding MB/s of glm_hpc's GLM-4 tokenizer next to npm tiktoken's (Rust core in WASM), on the
# same text with the same ranks (cl100k_base, dumped from the npm package), each pinned to one
# core, and their ratio. Both must produce the same number of tokens.
#   bash benchmarks/checks/tokenizer_vs_tiktoken.sh [BUILD_DIR (default build)] [MB of text (default 8)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
megabytes=${2:-8}
peer=tools/tiktoken_peer
bench="$build/benchmarks/bench_tokenizer"
if [ ! -x "$bench" ]; then
  echo "missing $bench: cmake --build $build --target bench_tokenizer" >&2
  exit 2
fi
if [ ! -f "$peer/node_modules/tiktoken/package.json" ]; then
  echo "missing $peer/node_modules: bash scripts/setup.sh" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node "$peer/peer.cjs" ranks "$work/cl100k_base.tiktoken"

# The repository's prose and code, and the multilingual test corpus (Chinese, emoji, whitespace
# runs, ...) ten times so that it weighs in, repeated up to the requested size.
{
  git ls-files -z -- '*.md' '*.cpp' '*.h' '*.cu' '*.py' '*.sh' '*.cfg' | xargs -0 cat
  for _ in $(seq 10); do
    node -e 'const fs = require("fs"); process.stdout.write(JSON.parse(fs.readFileSync(process.argv[1], "utf8")).join("\n"))' \
      tests/data/tokenizer/peer_corpus.json
  done
} > "$work/unit.txt"
while [ "$(stat -c %s "$work/corpus.txt" 2>/dev/null || echo 0)" -lt $((megabytes * 1000000)) ]; do
  cat "$work/unit.txt" >> "$work/corpus.txt"
done

pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 0); fi
ours=$("${pin[@]}" "$bench" "$work/cl100k_base.tiktoken" "$work/corpus.txt" 5)
theirs=$("${pin[@]}" node "$peer/peer.cjs" bench "$work/corpus.txt" 5)
echo "glm_hpc:  $ours"
echo "tiktoken: $theirs"
read -r _ ours_mbs _ ours_tokens _ bytes _ <<<"$ours"
read -r _ theirs_mbs _ theirs_tokens _ _ <<<"$theirs"
if [ "$ours_tokens" != "$theirs_tokens" ]; then
  echo "token counts differ ($ours_tokens vs $theirs_tokens): the comparison is void" >&2
  exit 1
fi
awk -v a="$ours_mbs" -v b="$theirs_mbs" -v n="$bytes" \
  'BEGIN { printf "corpus %.1f MB, one core each: glm_hpc %.2f MB/s, tiktoken %.2f MB/s, ratio %.2fx\n", n / 1e6, a, b, a / b }'
