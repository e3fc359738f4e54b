"""torch.optim.AdamW on CPU tensors, the peer of bench_host_adamw: one fp32 parameter of N elements
with its gradient, T threads: as torch.optim.AdamW is constructed by default (on CPU tensors its
per-tensor loop), foreach, and (where this torch has it) fused; best of R steps each. Prints one line per implementation and the fastest as torch_adamw_melem_per_s.
Usage: python3 torch_cpu_adamw.py [--elements N] [--threads T] [--repeat R]"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 27)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    best_rate = 0.0
    for impl in ("default", "foreach", "fused"):
        p = torch.nn.Parameter(torch.randn(a.elements) * 0.01)
        p.grad = torch.randn(a.elements) * 1e-3
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, **({} if impl == "default" else {impl: True}))
            opt.step()  # allocates the moments
        except (RuntimeError, TypeError) as e:
            print(f"torch AdamW {impl}: unavailable ({e})")
            continue
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
        rate = a.elements / best / 1e6
        best_rate = max(best_rate, rate)
        print(f"torch AdamW {impl}: {best * 1e3:.2f} ms, {rate:.0f} Melem/s ({a.threads} threads)")
    print(f"torch_adamw_melem_per_s {best_rate:.1f}")


if __name__ == "__main__":
    main()
