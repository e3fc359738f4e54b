#!/usr/bin/env python3
"""The PyTorch peer for the LoRA benchmark (issue 10): transformers GlmForCausalLM with
GLM-4-9B-Chat's shapes (40 layers unless --layers), random init, bf16 base (frozen), PEFT LoRA
r 8 / alpha 32 / dropout 0.05 on q/k/v/o/gate_up/down, seq 8192, micro-batch 1, SDPA attention,
fused AdamW over the adapters; without and with gradient checkpointing (transformers' per-layer
checkpointing, use_reentrant=False). Prints tokens/s, model TFLOP/s, MFU against 989 TFLOP/s and
peak memory. FLOPs per token count what LoRA training computes of the frozen base (forward and
input gradient: 4 x matmul parameters) plus attention forward and backward (6 x layers x hidden x
seq, the full-training convention, causal half), adapters neglected; recomputation not counted."""
import argparse
import time

import torch
from peft import LoraConfig, get_peft_model
from glm_shapes import flops_per_token, glm4_9b_config
from transformers import GlmForCausalLM


def run(model, opt, ids, labels, steps, warmup):
    def step():
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

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
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--modes", default="none,checkpointing")
    # SFT-shaped rows: the first fraction is prompt (label -100), as lora_bench.sh's GLM_LORA_PROMPT_FRACTION.
    p.add_argument("--prompt_fraction", type=float, default=0.0)
    a = p.parse_args()
    cfg = glm4_9b_config(a.layers)
    flops = flops_per_token(a.layers, a.seq, matmul_passes=4)
    ids = torch.randint(0, cfg.vocab_size, (1, a.seq), device="cuda")
    labels = ids.clone()
    labels[:, : int(a.prompt_fraction * a.seq)] = -100
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GlmForCausalLM(cfg).to(torch.bfloat16)
        if mode == "checkpointing":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        lora = LoraConfig(r=8, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"])
        model = get_peft_model(model, lora)
        trainable = [q for q in model.parameters() if q.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
        model.train()
        secs, peak = run(model, opt, ids, labels, a.steps, warmup=2)
        tps = a.seq / secs
        print(f"peer lora {mode}: {tps:.0f} tokens/s, {tps * flops / 1e12:.1f} TFLOP/s, "
              f"MFU {100 * tps * flops / 989e12:.1f}%, peak {peak / 2**30:.1f} GiB, "
              f"{sum(q.numel() for q in trainable)} trainable", flush=True)
        del model, opt, trainable
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
