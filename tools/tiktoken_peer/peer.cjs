#!/usr/bin/env node
// npm tiktoken as the outside oracle for glm_hpc's C++ tokenizer: dumps cl100k_base's ranks in
// the tiktoken rank-file format (GLM-4's tokenizer.model format), encodes a test corpus, and
// times encoding for benchmarks/checks/tokenizer_vs_tiktoken.sh. Installed by scripts/setup.sh.
//
//   node peer.cjs ranks OUT.tiktoken           cl100k_base ranks, "base64 rank" per line
//   node peer.cjs encode CORPUS.json OUT.json  ids of each document and of all joined with "\n"
//   node peer.cjs bench TEXT_FILE [repeats]    prints "tiktoken_mb_per_s X tokens N bytes B"
"use strict";
const fs = require("fs");

function requirePackage(name) {
  try {
    return require(name);
  } catch (e) {
    process.stderr.write(`tiktoken_peer: cannot load '${name}' (${e.code || e.message}); ` +
                         "run `bash scripts/setup.sh` (it runs npm ci in tools/tiktoken_peer)\n");
    process.exit(3);
  }
}
const { Tiktoken } = requirePackage("tiktoken");
const cl100k = requirePackage("tiktoken/encoders/cl100k_base.json");

// GLM4_SPEC.md 5.2. Passed explicitly, so the oracle splits text exactly as GLM-4 does even if a
// later package revision rewrote cl100k's pattern.
const GLM4_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

// The package ships ranks compactly: a line "! FIRST tok tok ..." gives consecutive ranks from
// FIRST; a line "tok rank" is one token (the plain tiktoken format).
function rankLines(bpeRanks) {
  const out = [];
  for (const line of bpeRanks.split("\n")) {
    if (line === "") continue;
    const fields = line.split(" ");
    if (fields[0] === "!") {
      const first = Number(fields[1]);
      for (let i = 2; i < fields.length; ++i) out.push(`${fields[i]} ${first + i - 2}`);
    } else {
      out.push(line);
    }
  }
  return out;
}

function encoder() {
  return new Tiktoken(cl100k.bpe_ranks, cl100k.special_tokens, GLM4_PATTERN);
}

const [command, ...args] = process.argv.slice(2);
if (command === "ranks" && args.length === 1) {
  fs.writeFileSync(args[0], rankLines(cl100k.bpe_ranks).join("\n") + "\n");
} else if (command === "encode" && args.length === 2) {
  const documents = JSON.parse(fs.readFileSync(args[0], "utf8"));
  const enc = encoder();
  // encode_ordinary: special-token text is ordinary text, as in glm_hpc's encode.
  const result = {
    documents: documents.map((d) => Array.from(enc.encode_ordinary(d))),
    joined: Array.from(enc.encode_ordinary(documents.join("\n"))),
  };
  enc.free();
  fs.writeFileSync(args[1], JSON.stringify(result));
} else if (command === "bench" && (args.length === 1 || args.length === 2)) {
  const text = fs.readFileSync(args[0], "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  const repeats = args.length === 2 ? Number(args[1]) : 5;
  const enc = encoder();
  let tokens = enc.encode_ordinary(text).length;  // warm-up (and WASM compilation)
  let best = Infinity;
  for (let r = 0; r < repeats; ++r) {
    const start = process.hrtime.bigint();
    tokens = enc.encode_ordinary(text).length;
    best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
  }
  enc.free();
  console.log(`tiktoken_mb_per_s ${(bytes / 1e6 / best).toFixed(2)} tokens ${tokens} bytes ${bytes}`);
} else {
  process.stderr.write("usage: peer.cjs ranks OUT | encode CORPUS.json OUT.json | bench TEXT_FILE [repeats]\n");
  process.exit(2);
}
