# PyTorch's NCCL collectives at one size, timed and reported as bench_comm does (nccl-tests' algbw
# and busbw, slowest rank's time): the same-call peer of benchmarks/calls/comm_x2.sh.
#   torchrun --standalone --nproc_per_node 2 benchmarks/peers/torch_nccl_bench.py --bytes 1G --dtype bf16
# dist.all_reduce works in place (PyTorch has no out-of-place form); reduce_scatter_tensor and
# all_gather_into_tensor are out of place, as bench_comm's three are.
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text):
    text = text.removesuffix("iB")
    digits = text.rstrip("BKMG")
    return int(digits) * UNITS[text[len(digits):].upper()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", default="1G", help="full (unsharded) buffer, K/M/G suffixes")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default="")
    args = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    try:
        dist.init_process_group("nccl", device_id=device)
    except TypeError:  # PyTorch before 2.3 has no device_id
        dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    element = torch.tensor([], dtype=dtype).element_size()
    count = parse_bytes(args.bytes) // element // n * n
    block = count // n

    full = torch.ones(count, dtype=dtype, device=device)
    shard = torch.ones(block, dtype=dtype, device=device)
    gathered = torch.empty(count, dtype=dtype, device=device)
    calls = {
        "all_reduce": (2 * (n - 1) / n, lambda: dist.all_reduce(full)),
        "reduce_scatter": ((n - 1) / n, lambda: dist.reduce_scatter_tensor(shard, full)),
        "all_gather": ((n - 1) / n, lambda: dist.all_gather_into_tensor(gathered, shard)),
    }
    rows = []
    for name, (bus_factor, call) in calls.items():
        if name == "reduce_scatter":
            full.fill_(1)  # all_reduce grew it; the sum of ones is checked below
        for _ in range(args.warmup):
            call()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.iters):
            call()
        torch.cuda.synchronize()
        seconds = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank, as nccl-tests reports
        seconds = seconds.item()
        if name == "reduce_scatter":
            # Every rank's input is ones, so each reduced element is n.
            assert torch.all(shard == n).item(), "reduce_scatter_tensor result is wrong"
        if name == "all_gather":  # the shards gathered are the reduce-scatter's results
            assert torch.all(gathered == n).item(), "all_gather_into_tensor result is wrong"
        size = count * element
        algbw = size / seconds / 1e9
        row = {"collective": name, "size": size, "count": count, "type": args.dtype, "time_us": seconds * 1e6,
               "algbw": algbw, "busbw": algbw * bus_factor}
        rows.append(row)
        if rank == 0:
            print(f"peer torch {name} {args.dtype} size {size} B: time {row['time_us']:.1f} us, "
                  f"algbw {algbw:.2f} GB/s, busbw {row['busbw']:.2f} GB/s", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "torch_nccl_bench", "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "world_size": n, "iters": args.iters, "warmup": args.warmup, "rows": rows}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
