#!/usr/bin/env python3
"""A GLM-4-architecture model and batch that no test has seen, and transformers' numbers for them.

Draws a configuration from the seed (head size 128, the wgmma attention kernels, or a small one, the
mma.sync kernels; 2 or 4 KV heads; odd vocabulary, FFN width, rope base and sequence lengths),
builds GlmForCausalLM with random weights (norms and biases perturbed too) and writes to OUT_DIR:
  model/          config.json + model.safetensors (transformers' glm layout, float32)
  data.jsonl      rows of {"input_ids", "labels"} (a prompt and random tokens without a label)
  reference.json  the configuration, transformers' fp32 loss of the rows (the mean over every
                  labelled token of every row, each row its own sequence), and the losses of
                  `steps` full-batch AdamW steps (decay on weights and embeddings, constant lr,
                  clipping at 1), the recipe benchmarks/checks/unseen_parity.sh gives glm_hpc.

usage: python3 benchmarks/peers/unseen_parity.py SEED OUT_DIR
"""
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from make_parity_fixtures import check_rope, make_config, randomize  # noqa: E402
from transformers import GlmForCausalLM  # noqa: E402

torch.set_float32_matmul_precision("highest")
torch.set_num_threads(8)

RECIPE = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, max_grad_norm=1.0, steps=5)


def draw(seed):
    rng = random.Random(seed)
    head_dim = rng.choice([128, 128, 32, 64])
    heads = rng.choice([4, 8]) if head_dim == 128 else rng.choice([4, 8, 16])
    kv = rng.choice([2, 4])
    f = dict(vocab_size=rng.randrange(300, 4000), hidden_size=heads * head_dim,
             intermediate_size=rng.randrange(heads * head_dim // 2, 3 * heads * head_dim),
             num_hidden_layers=rng.randint(1, 3), num_attention_heads=heads, num_key_value_heads=kv,
             head_dim=head_dim, rope_theta=rng.choice([1e4, 5e5, 5e6, 1e8]),
             rms_norm_eps=rng.choice([1e-5, 1.5625e-07]))
    rows = [rng.randrange(17, 700) for _ in range(rng.randint(2, 5))]
    return f, rows, rng


def main():
    seed, out_dir = int(sys.argv[1]), sys.argv[2]
    f, rows, rng = draw(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = GlmForCausalLM(make_config(f)).float()
    randomize(model, generator)
    with torch.no_grad():  # larger weights than the 0.02 init: logits far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(2.5)
    check_rope(model, f)
    path = os.path.join(out_dir, "model")
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:  # transformers 5 always writes safetensors
        model.save_pretrained(path)

    batch = []
    with open(os.path.join(out_dir, "data.jsonl"), "w") as fh:
        for length in rows:
            ids = torch.randint(0, f["vocab_size"], (length,), generator=generator)
            labels = ids.clone()
            labels[: rng.randrange(1, length // 2)] = -100  # a prompt
            labels[torch.rand(length, generator=generator) < 0.1] = -100
            fh.write(json.dumps({"input_ids": ids.tolist(), "labels": labels.tolist()}) + "\n")
            batch.append((ids, labels))

    def window_loss():
        total, count = 0.0, 0
        for ids, labels in batch:
            logits = model(input_ids=ids[None]).logits[0, :-1].float()
            target = labels[1:]
            keep = target != -100
            total = total + torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
            count += int(keep.sum())
        return total / count

    model.eval()
    with torch.no_grad():
        eval_loss = window_loss().item()
    model.train()
    decay = [p for n, p in model.named_parameters() if not ("norm" in n or n.endswith(".bias"))]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n or n.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": RECIPE["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=RECIPE["lr"], betas=RECIPE["betas"], eps=RECIPE["eps"], foreach=False)
    losses = []
    for _ in range(RECIPE["steps"]):
        opt.zero_grad()
        loss = window_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["max_grad_norm"])
        opt.step()
        losses.append(loss.item())
    info = {"seed": seed, "config": f, "rows": rows, "eval_loss": eval_loss, "recipe": RECIPE, "losses": losses}
    with open(os.path.join(out_dir, "reference.json"), "w") as fh:
        json.dump(info, fh)
    print(f"seed {seed}: {json.dumps(f)} rows {rows}; transformers fp32 loss {eval_loss:.6f}, "
          f"{RECIPE['steps']} steps {[round(x, 5) for x in losses]}")


if __name__ == "__main__":
    main()
