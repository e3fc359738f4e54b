#!/usr/bin/env python3
"""Greedy continuations from transformers' generate() for glm_hpc's generation tests.

For each parity fixture directory (tools/make_parity_fixtures.py wrote them: config.json and
model.safetensors of a random GlmForCausalLM), loads the model on the CPU in float32 (eager
attention) and continues three seeded random prompts of different lengths by 32 tokens with
generate(do_sample=False), no end token, so every continuation is 32 tokens long. Writes
OUT_DIR/<fixture>/generate.json:
  prompts          the prompts' token ids
  greedy           the 32 generated ids of each prompt
  margins          at every step, the chosen logit minus the runner-up (small: a near tie that
                   another correct implementation may break the other way)
  max_new_tokens, transformers_version, torch_version

usage: python3 tools/make_generate_fixtures.py FIXTURES_DIR OUT_DIR [NAME...]   (default: glm_a glm_b)
"""
import json
import os
import sys

import torch
import transformers
from transformers import GlmForCausalLM

torch.set_float32_matmul_precision("highest")
torch.set_num_threads(8)

MAX_NEW_TOKENS = 32
PROMPT_LENGTHS = (1, 9, 57)


def continue_greedily(model, prompt):
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS, eos_token_id=None,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True, num_beams=1)
    tokens = out.sequences[0, len(prompt):].tolist()
    margins = []
    for scores in out.scores:
        top = torch.topk(scores[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    return tokens, margins


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    fixtures, out_dir = sys.argv[1], sys.argv[2]
    for name in sys.argv[3:] or ["glm_a", "glm_b"]:
        model = GlmForCausalLM.from_pretrained(os.path.join(fixtures, name), torch_dtype=torch.float32,
                                               attn_implementation="eager")
        model.eval()
        generator = torch.Generator().manual_seed(2026)
        vocab = model.config.vocab_size
        prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
        result = {"prompts": prompts, "greedy": [], "margins": [], "max_new_tokens": MAX_NEW_TOKENS,
                  "transformers_version": transformers.__version__, "torch_version": torch.__version__}
        with torch.no_grad():
            for prompt in prompts:
                tokens, margins = continue_greedily(model, prompt)
                assert len(tokens) == MAX_NEW_TOKENS, (name, len(tokens))
                result["greedy"].append(tokens)
                result["margins"].append(margins)
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        with open(os.path.join(out_dir, name, "generate.json"), "w") as fh:
            json.dump(result, fh)
        print(name, "smallest margin", min(min(m) for m in result["margins"]))


if __name__ == "__main__":
    main()
