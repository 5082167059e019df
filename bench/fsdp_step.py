"""FSDP2 (``fully_shard``) training steps on ringreduce, on Gloo, and on one rank.

    python bench/fsdp_step.py                         # 2 ranks; 1 rank; Gloo; 5 runs
    python bench/fsdp_step.py --ranks 2 --layers 24 --width 512 --batch 16 --runs 3

The model: ``--layers`` ``Linear(width, width)`` + ReLU, each layer ``fully_shard``ed and
then the whole model, Adam; one torch thread per rank; float32 on the CPU. Every run
starts each configuration in turn (ringreduce on --ranks ranks, the same on one rank,
Gloo on --ranks ranks), so that all see the same machine; each reports the median step
time over --steps steps after --warmup, the slowest rank's. The table gives each
configuration's median over the runs (min..max) and ringreduce's ratio to one rank and
to Gloo, run by run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

from ringreduce.launch import free_port


def _rank(rank: int, size: int, port: int, backend: str, args: argparse.Namespace, out) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ringreduce.torch  # noqa: F401 (registers "ringreduce")

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=size)
    mesh = init_device_mesh("cpu", (size,))
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, args.width, generator=g)
    times = []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(float(mine))
    dist.destroy_process_group()


def run(backend: str, size: int, args: argparse.Namespace) -> float:
    """The slowest rank's median step in seconds."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port("127.0.0.1", span=1)
    procs = [
        ctx.Process(target=_rank, args=(r, size, port, backend, args, out)) for r in range(size)
    ]
    for p in procs:
        p.start()
    value = out.get(timeout=600)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            # After the result: torch's Gloo threads can abort the process at exit
            # ("terminate called without an active exception"), which the measurement
            # does not depend on.
            print(f"# note: {backend} on {size} ranks: a rank exited with {p.exitcode}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    configs = [("ringreduce", args.ranks), ("ringreduce", 1), ("gloo", args.ranks)]
    results: dict = {c: [] for c in configs}
    for _ in range(args.runs):
        for backend, size in configs:
            results[(backend, size)].append(run(backend, size, args))
    print(
        f"# FSDP2, {args.layers} x Linear({args.width}, {args.width}), batch {args.batch}, "
        f"1 torch thread per rank, {args.steps} steps after {args.warmup}; ms per step, "
        f"median over {args.runs} runs (min..max)"
    )
    for (backend, size), values in results.items():
        ms = [v * 1e3 for v in values]
        print(
            f"{backend:>10s} {size} rank(s)  {statistics.median(ms):8.1f}  "
            f"({min(ms):.1f}..{max(ms):.1f})"
        )
    ours, solo, gloo = (results[c] for c in configs)
    to_solo = [a / b for a, b in zip(ours, solo)]
    to_gloo = [a / b for a, b in zip(ours, gloo)]
    print(f"ringreduce / 1 rank, by run: {' '.join(f'{r:.2f}' for r in to_solo)}")
    print(f"ringreduce / gloo,   by run: {' '.join(f'{r:.2f}' for r in to_gloo)}")


if __name__ == "__main__":
    main()
