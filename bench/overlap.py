"""How much gradient communication GradSync hides behind backward, against the baselines.

    python bench/overlap.py -n 4                        # spawns 4 local ranks
    ringreduce launch -n 4 -- python bench/overlap.py   # or under the launcher
    python bench/overlap.py -n 2 --width 256 --depth 2  # quick smoke run

A torch MLP (default 8 x 2048^2: 33.6 M parameters, 134 MB of float32 gradients) trains on
random data on N local ranks. Per-step time, median over the timed steps and the slowest
rank, for:

  (a) compute   forward + backward, no communication;
  (b) flat      forward + backward, then one all-reduce of all gradients (no overlap);
  (c) gradsync  rr.torch.GradSync: buckets all-reduced during backward;
  (d) ddp       torch DistributedDataParallel on Gloo (also overlapped).

Exposed communication of a mode = its step time minus (a): the part of the step spent on
communication that backward did not hide; the table shows it as a fraction of the step.
On a machine with few cores the ranks, their communication threads and backward share the
cores, so the numbers measure that contention as much as the network.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

MODES = ("compute", "flat", "gradsync", "ddp")


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(width: int, depth: int) -> Any:
    import torch

    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def flat_all_reduce(model: Any, comm: Any) -> None:
    """Baseline (b): every gradient in one flat buffer, one all-reduce, copied back."""
    import torch

    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    buf = flat.numpy()
    comm.all_reduce(buf, op="avg", out=buf)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def timed_steps(step: Callable[[], None], comm: Any, warmup: int, steps: int) -> list[float]:
    """Runs warmup + steps training steps; returns the timed steps' seconds."""
    times = []
    for i in range(warmup + steps):
        comm.barrier()  # start every rank's step together, as in real training
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def worker(rank: int, world: int, rr_port: int, gloo_port: int, args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import ringreduce as rr

    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    # MASTER_ADDR names rank 0's host when ranks run on several (emulated) hosts,
    # e.g. network namespaces from bench/netns_hosts.sh; set GLOO_SOCKET_IFNAME there.
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if addr.startswith("127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    comm = rr.init("tcp", rank=rank, world_size=world, master_addr=addr, master_port=rr_port)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{gloo_port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = build_model(args.width, args.depth)
    n_params = sum(p.numel() for p in model.parameters())
    x = torch.randn(args.batch, args.width)
    loss_fn = torch.nn.MSELoss()
    target = torch.randn(args.batch, args.width)

    def compute(net: Any) -> None:
        for p in net.parameters():
            p.grad = None
        loss_fn(net(x), target).backward()

    results: dict[str, list[float]] = {}
    results["compute"] = timed_steps(lambda: compute(model), comm, args.warmup, args.steps)
    results["flat"] = timed_steps(
        lambda: (compute(model), flat_all_reduce(model, comm)), comm, args.warmup, args.steps
    )
    sync = rr.torch.GradSync(
        model, comm, bucket_mb=args.bucket_mb, first_bucket_mb=args.first_bucket_mb
    )
    results["gradsync"] = timed_steps(
        lambda: (compute(model), sync.wait()), comm, args.warmup, args.steps
    )
    sync.remove()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    results["ddp"] = timed_steps(lambda: compute(ddp), comm, args.warmup, args.steps)
    summary = sync.summary()

    # The job is as slow as its slowest rank.
    medians = np.array([statistics.median(results[m]) for m in MODES])
    slowest = comm.all_reduce(medians, op="max")
    if rank == 0:
        base = slowest[0]
        print(
            f"{world} ranks, {n_params / 1e6:.1f} M parameters "
            f"({n_params * 4 / 1e6:.0f} MB float32 gradients), batch {args.batch}/rank, "
            f"{torch.get_num_threads()} threads/rank, {len(sync.bucketer.plan)} buckets"
        )
        print("| mode | step (ms) | exposed comm (ms) | exposed fraction of step |")
        print("|---|---:|---:|---:|")
        for mode, t in zip(MODES, slowest):
            exposed = max(t - base, 0.0) if mode != "compute" else 0.0
            print(f"| {mode} | {t * 1e3:.1f} | {exposed * 1e3:.1f} | {exposed / t:.1%} |")
        print(
            f"gradsync's own count: {summary['comm_s'] / max(summary['steps'], 1) * 1e3:.1f} "
            f"ms of all-reduce per step, {summary['exposed_fraction']:.1%} of it exposed "
            f"in wait()"
        )
    dist.destroy_process_group()
    comm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-n",
        "--nprocs",
        type=int,
        default=2,
        help="local ranks to spawn (ignored under ringreduce launch)",
    )
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="rows per rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--first-bucket-mb", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per rank")
    args = parser.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Under ringreduce launch: this process is one rank. Rank 0 picks the Gloo port
        # next to the rendezvous port the launcher chose.
        port = int(os.environ.get("MASTER_PORT", "29500"))
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), port, port + 1, args)
        return
    ctx = mp.get_context("spawn")
    rr_port, gloo_port = free_port(), free_port()
    procs = [
        ctx.Process(target=worker, args=(r, args.nprocs, rr_port, gloo_port, args))
        for r in range(args.nprocs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise SystemExit(f"ranks {failed} failed")


if __name__ == "__main__":
    main()
