#!/usr/bin/env python3
"""The PyTorch peer for the multi-GPU benchmark (issue 5): transformers GlmForCausalLM with
GLM-4-9B-Chat's real shapes (40 layers, random init), PyTorch FSDP2 (fully_shard per decoder layer
and at the root; bf16 parameters, fp32 gradient reduction, fp32 sharded master weights), SDPA
attention, AdamW, seq 4096, micro-batch 1 per GPU. Modes: eager, eager with activation
checkpointing (ckpt), torch.compile per layer (compile), and checkpointing with the parameters,
gradients and optimizer state offloaded to the CPU (offload: FSDP2's CPUOffloadPolicy, pinned; the
optimizer then steps on the CPU with torch's fused AdamW; offload_default: with torch.optim.AdamW as
constructed by default), the peer of --offload_optimizer cpu. The peak memory counts from after
the model is built and sharded.

Launch: torchrun --nproc_per_node N benchmarks/peers/hf_glm_fsdp_peer.py [--modes eager,ckpt]
Rank 0 prints one line per mode: tokens/s per GPU, model TFLOP/s per GPU, MFU against 989 TFLOP/s
and the peak memory of the GPU (torch.cuda.max_memory_reserved), FLOPs as GLM4_SPEC.md section 3."""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from glm_shapes import flops_per_token, glm4_9b_config
from transformers import GlmForCausalLM


def build(cfg, mode):
    torch.manual_seed(0)
    offload = mode.startswith("offload")
    with torch.device("cuda"):
        model = GlmForCausalLM(cfg)  # fp32 master weights, initialised on the GPU (fast)
    if mode == "ckpt" or offload:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    extra = {"offload_policy": CPUOffloadPolicy(pin_memory=True)} if offload else {}
    for layer in model.model.layers:
        if mode == "compile":
            layer.compile()
        fully_shard(layer, mp_policy=mp, **extra)
    fully_shard(model, mp_policy=mp, **extra)
    if mode == "offload_default":  # torch.optim.AdamW as constructed by default (on CPU tensors: per tensor)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-5)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    return model, opt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="eager,ckpt")
    a = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = glm4_9b_config(a.layers)
    flops = flops_per_token(a.layers, a.seq)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    ids = torch.randint(0, cfg.vocab_size, (1, a.seq), device="cuda", generator=g)
    for mode in a.modes.split(","):
        model, opt = build(cfg, mode)
        # The peak from here: the fp32 model built on the GPU before fully_shard moved it is not the step's.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        secs = (time.perf_counter() - t0) / a.steps
        peak = torch.tensor([torch.cuda.max_memory_reserved() / 2**30], device="cuda")
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        if rank == 0:
            tps = a.seq / secs
            print(f"peer fsdp2 {mode}: {tps:.0f} tokens/s per GPU, {tps * flops / 1e12:.1f} TFLOP/s per GPU, "
                  f"MFU {100 * tps * flops / 989e12:.1f}%, peak {peak.item():.1f} GiB, {world} GPUs", flush=True)
        del model, opt
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
