#!/usr/bin/env python3
"""PyTorch's matmuls on the GEMM shapes of benchmarks/bench_gemm.cpp (one GLM-4-9B layer and the
lm_head at seq 4096 and 8192; forward y = x W^T, input gradient dy W, weight gradient dy^T x),
bf16 with fp32 accumulation, the same random scales. Prints TFLOP/s per row so the two tables
sit side by side."""
import torch

LINEARS = [("query_key_value", 4096, 4608), ("dense", 4096, 4096), ("dense_h_to_4h", 4096, 27392),
           ("dense_4h_to_h", 13696, 4096), ("lm_head", 4096, 151552), ("square 8192", 8192, 8192)]


def seconds(fn, reps=10):
    fn()
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def main():
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    total = 0.0
    for n in (4096, 8192):
        for name, fin, fout in LINEARS:
            rows = 8192 if name == "square 8192" else n
            x = torch.randn(rows, fin, device="cuda", dtype=torch.bfloat16) * 0.5
            w = torch.randn(fout, fin, device="cuda", dtype=torch.bfloat16) * 0.02
            dy = torch.randn(rows, fout, device="cuda", dtype=torch.bfloat16) * 0.01
            flops = 2.0 * rows * fin * fout
            for pass_name, fn in (("fwd", lambda: torch.nn.functional.linear(x, w)),
                                  ("dgrad", lambda: dy @ w),
                                  ("wgrad", lambda: dy.t() @ x)):
                s = seconds(fn)
                if name != "square 8192":
                    total += s
                print(f"torch {name:16s} {pass_name:5s} {rows:6d} | {flops / s / 1e12:7.1f} TFLOP/s")
            del x, w, dy
    print(f"torch one layer + lm_head, both lengths: {total * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
