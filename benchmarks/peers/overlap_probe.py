#!/usr/bin/env python3
"""Can a memory-bound optimizer update hide under compute-bound GEMMs on one GPU? Times a
GLM-4-9B forward-like GEMM sequence (12 layers, 4096 tokens) and a fused AdamW over ~2.8B fp32
parameters (28 bytes per parameter, as ours), serially and on two streams, with cuBLAS told to
leave N SMs free (PyTorch's sm carveout) for the optimizer. Prints ms per variant."""
import torch

torch.manual_seed(0)
dev = "cuda"
n, h = 4096, 4096
shapes = [(4608, 4096), (4096, 4096), (27392, 4096), (4096, 13696)]
W = [[torch.randn(o, i, device=dev, dtype=torch.bfloat16) * 0.02 for (o, i) in shapes] for _ in range(12)]
x = torch.randn(n, h, device=dev, dtype=torch.bfloat16)
mid = torch.randn(n, 13696, device=dev, dtype=torch.bfloat16)


def gemms():
    for layer in W:
        torch.matmul(x, layer[0].t())
        torch.matmul(x, layer[1].t())
        torch.matmul(x, layer[2].t())
        torch.matmul(mid, layer[3].t())


params = [torch.randn(230_000_000, device=dev) for _ in range(12)]
for p in params:
    p.grad = torch.randn_like(p) * 1e-3
opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
opt.step()


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


side = torch.cuda.Stream()


def concurrent():
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        opt.step()
    gemms()
    torch.cuda.current_stream().wait_stream(side)


tg = timed(gemms)
ta = timed(opt.step)
print(f"gemms {tg:.2f} ms, adamw {ta:.2f} ms, serial sum {tg + ta:.2f} ms")
carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
for sms in [0, 8, 16, 24, 32, 48]:
    if sms and carve is None:
        print("no sm carveout in this PyTorch")
        break
    if carve is not None:
        carve(sms if sms else None)
    tg2 = timed(gemms)
    tc = timed(concurrent)
    print(f"carveout {sms:2d} SMs: gemms alone {tg2:.2f} ms, gemms || adamw {tc:.2f} ms "
          f"(hides {100 * (tg + ta - tc) / ta:.0f}% of adamw)")
