#!/usr/bin/env python3
"""Greedy and beam-search continuations from transformers' generate() for glm_hpc's generation tests.

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
and OUT_DIR/<fixture>/beam_search.json: generate(num_beams=N, do_sample=False) of the same prompts
under the settings of BEAM_CASES (beam widths, end tokens the beams do produce, length penalties of
both signs, each early_stopping mode, a repetition penalty):
  prompts          as above
  cases            each case's settings (num_beams, eos_token_id, length_penalty, early_stopping,
                   repetition_penalty, max_new_tokens) and, per prompt, the best hypothesis'
                   generated ids (an end token included), its score (sequences_scores) and the
                   steps the search took before it stopped (len(scores))

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


# The end tokens of the later cases are tokens of case 0's best reply (at these positions), so that
# hypotheses do end early; case 0 keeps the model's end ids, which its vocabulary never produces.
BEAM_CASES = (
    dict(num_beams=3, eos=None, length_penalty=1.0, early_stopping=False, repetition_penalty=1.0, max_new_tokens=12),
    dict(num_beams=4, eos=(2, 5), length_penalty=1.0, early_stopping=False, repetition_penalty=1.0, max_new_tokens=16),
    dict(num_beams=2, eos=(2, 5), length_penalty=2.0, early_stopping="never", repetition_penalty=1.0,
         max_new_tokens=16),
    dict(num_beams=3, eos=(1, 4), length_penalty=0.0, early_stopping=True, repetition_penalty=1.3, max_new_tokens=16),
    dict(num_beams=5, eos=(3,), length_penalty=-1.0, early_stopping=False, repetition_penalty=1.0, max_new_tokens=10),
)


def beam_search(model, prompt, num_beams, eos, length_penalty, early_stopping, repetition_penalty, max_new_tokens):
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=num_beams,
                         eos_token_id=eos, length_penalty=length_penalty, early_stopping=early_stopping,
                         repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens, pad_token_id=0,
                         num_return_sequences=1, output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), float(out.sequences_scores[0]), len(out.scores)


def beam_fixture(model, prompts):
    model_eos = list(model.config.eos_token_id or [])
    cases = []
    first = None
    for case in BEAM_CASES:
        settings = dict(case)
        positions = settings.pop("eos")
        replies, scores, steps, eos_ids = [], [], [], []
        for i, prompt in enumerate(prompts):
            eos = model_eos if positions is None else sorted({first[i][p] for p in positions})
            tokens, score, taken = beam_search(model, prompt, eos=eos, **settings)
            replies.append(tokens)
            scores.append(score)
            steps.append(taken)
            eos_ids.append(eos)
        if first is None:
            first = replies
        ended = sum(1 for r, e in zip(replies, eos_ids) if r and r[-1] in e)
        print("  beams", settings["num_beams"], "replies of", [len(r) for r in replies], "tokens,", ended, "ended")
        cases.append(dict(settings, eos_token_id=eos_ids, replies=replies, scores=scores, steps=steps))
    return cases


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
        with torch.no_grad():
            beams = {"prompts": prompts, "cases": beam_fixture(model, prompts),
                     "transformers_version": transformers.__version__, "torch_version": torch.__version__}
        with open(os.path.join(out_dir, name, "beam_search.json"), "w") as fh:
            json.dump(beams, fh)
        print(name, "smallest margin", min(min(m) for m in result["margins"]))


if __name__ == "__main__":
    main()
