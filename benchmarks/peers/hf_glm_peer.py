#!/usr/bin/env python3
"""The PyTorch peer for the end-to-end benchmark: transformers GlmForCausalLM with GLM-4-9B shapes
cut to N layers (default 12), random init, seq 4096, micro-batch 1, SDPA attention, bf16 autocast
over fp32 weights, fused AdamW, no activation checkpointing; eager, then torch.compile.
Prints tokens/s, model TFLOP/s, MFU against 989 TFLOP/s and peak memory, with the FLOP count of
GLM4_SPEC.md section 3 (6 x matmul parameters + 6 x layers x 4096 x seq)."""
import argparse
import time

import torch
from glm_shapes import flops_per_token, glm4_9b_config
from transformers import GlmForCausalLM


def run(model, opt, ids, labels, steps, warmup):
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, torch.cuda.max_memory_allocated()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--modes", default="eager,compile")
    # SFT-shaped rows: the first fraction of each row is prompt (label -100, no loss), as the
    # end-to-end benchmark's GLM_E2E_PROMPT_FRACTION gives ours.
    p.add_argument("--prompt_fraction", type=float, default=0.0)
    a = p.parse_args()
    cfg = glm4_9b_config(a.layers)
    flops = flops_per_token(a.layers, a.seq)
    ids = torch.randint(0, cfg.vocab_size, (1, a.seq), device="cuda")
    labels = ids.clone()
    labels[:, : int(a.prompt_fraction * a.seq)] = -100
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        model = GlmForCausalLM(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        runner = torch.compile(model) if mode == "compile" else model
        secs, peak = run(runner, opt, ids, labels, a.steps, warmup=3 if mode == "eager" else 4)
        tps = a.seq / secs
        label = mode if a.prompt_fraction == 0 else f"{mode}_prompt{int(100 * a.prompt_fraction)}"
        print(f"peer {label}: {tps:.0f} tokens/s, {tps * flops / 1e12:.1f} TFLOP/s, MFU {100 * tps * flops / 989e12:.1f}%, "
              f"peak {peak / 2**30:.1f} GiB")
        del model, opt, runner
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
