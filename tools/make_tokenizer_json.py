#!/usr/bin/env python3
"""A Hugging Face tokenizer.json of a tiktoken rank file, built and checked with HF `tokenizers`.

GLM-4's Hugging Face repositories (THUDM/glm-4-9b-chat-hf) ship tokenizer.json, the same byte-level
BPE as tokenizer.model in the `tokenizers` library's format. glm_hpc reads both; this script makes
the test fixture for that: the rank file (default data/sample/tokenizer.model, the tiny
configuration's) converted as transformers' TikTokenConverter converts GLM-4's (vocabulary in
GPT-2's byte-to-unicode spelling, merges in rank order, the GLM-4 pre-tokenization regex split then
ByteLevel, the 14 special tokens after the ranks), then every text of
tests/data/tokenizer/peer_corpus.json encoded by `tokenizers` itself (not glm_hpc), which the
C++ test compares with both of glm_hpc's loaders.

Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_json_ids.json ({"texts": [...], "ids": [[...]]}).
Run where `tokenizers` is installed (the GPU machine).

usage: python3 tools/make_tokenizer_json.py OUT_DIR [RANK_FILE] [CORPUS]
"""
import base64
import json
import os
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
            "<|end_of_video|>"]


def bytes_to_unicode():
    """GPT-2's reversible map of the 256 bytes to printable characters (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def bpe_parts(ranks, token, max_rank):
    """The two parts byte-level BPE merges last to form `token`, using only ranks below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best, at = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts = parts[:at] + [parts[at] + parts[at + 1]] + parts[at + 2:]
    assert len(parts) == 2, (token, parts)
    return parts


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    rank_file = sys.argv[2] if len(sys.argv) > 2 else "data/sample/tokenizer.model"
    corpus = sys.argv[3] if len(sys.argv) > 3 else "tests/data/tokenizer/peer_corpus.json"
    ranks = {}
    with open(rank_file, "rb") as fh:
        for line in fh:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    u = bytes_to_unicode()
    spell = lambda b: "".join(u[x] for x in b)  # noqa: E731
    vocab = {spell(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            a, b = bpe_parts(ranks, token, rank)
            merges.append((spell(a), spell(b)))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == len(ranks) + i, (s, tok.token_to_id(s))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(corpus) as fh:
        texts = json.load(fh)
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    for t, i in zip(texts, ids):
        assert tok.decode(i, skip_special_tokens=False) == t, t
    with open(os.path.join(out_dir, "tokenizer_json_ids.json"), "w") as fh:
        json.dump({"texts": texts, "ids": ids, "tokenizers_version": tokenizers.__version__}, fh, ensure_ascii=False)
    print(f"{len(ranks)} ranks, {len(merges)} merges, {len(texts)} texts, {sum(map(len, ids))} ids; "
          f"tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
