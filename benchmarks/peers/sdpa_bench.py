#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (flash backend) on GLM-4-9B attention shapes: causal,
32 query heads on 2 KV groups, head_dim 128, bf16, one sequence of 4096 and of 8192 tokens.
Prints forward and backward time and TFLOP/s with the same FLOP convention as bench_kernels
(causal: forward 2 n^2 d h, backward 2.5 x that), so the rows sit next to ours. Arguments name
other SDPA backends to time as well (e.g. `cudnn`: cuDNN's fused attention, Hopper-specific)."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2] / 1e3


BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    for name in sys.argv[1:] or ["flash"]:
        try:
            run(name, BACKENDS[name])
        except RuntimeError as e:  # a backend this build or GPU lacks
            print(f"sdpa {name}: not available ({str(e).splitlines()[0]})")


def run(name, backend):
    heads, kv, d = 32, 2, 128
    for n in (4096, 8192):
        q = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        # GQA as GLM-4 runs it in transformers: K/V expanded to every query head.
        k = torch.randn(1, kv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, kv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16)

        def expand(t):
            return t.repeat_interleave(heads // kv, dim=1)

        with sdpa_kernel(backend):
            fwd = timed(lambda: F.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True))
            out = F.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True)
                o.backward(grad)

            both = timed(fwd_bwd)
        del out
        flops = 2.0 * n * n * d * heads
        bwd = max(both - fwd, 1e-9)
        print(f"sdpa {name} n={n}: forward {fwd * 1e3:.3f} ms ({flops / fwd / 1e12:.1f} TFLOP/s), "
              f"backward {bwd * 1e3:.3f} ms ({2.5 * flops / bwd / 1e12:.1f} TFLOP/s)")


if __name__ == "__main__":
    main()
