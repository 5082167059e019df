"""How much gradient communication GradSync hides behind backward, against the baselines.

    python bench/overlap.py -n 4                        # spawns 4 local ranks
    ringreduce launch -n 4 -- python bench/overlap.py   # or under the launcher
    python bench/overlap.py -n 2 --width 256 --depth 2  # quick smoke run

A torch MLP (default 8 x 2048^2: 33.6 M parameters, 134 MB of float32 gradients) trains on
random data on N local ranks. Per-step time, median over the timed steps and the slowest
rank, for each of these modes, one after the other in every run (--runs, default 3), so
that all of them see the same machine:

  (a) compute   forward + backward, no communication;
  (b) flat      forward + backward, then one all-reduce of all gradients (no overlap);
  (c) gradsync  rr.torch.GradSync: buckets all-reduced during backward (in windows where
                the ranks share the host over shared memory: the default);
  (c') gradsync-plain  the same with its buckets in plain memory (windows=False);
  (d) ddp       torch DistributedDataParallel on Gloo (also overlapped);
  (e) ddp-rr    the same DDP on the ringreduce torch.distributed backend
                (``dist.new_group(backend="ringreduce")``), to read against (d);
  (f) gradsync-<codec>, with ``--compression CODEC``: GradSync with that codec and error
                feedback (its compressed buckets run on the communicator's lane).

Exposed communication of a mode = its step time minus (a) of the same run: the part of the
step spent on communication that backward did not hide. The table shows the median over
runs (min..max in brackets) and, last, in how many runs GradSync exposed no more
communication than DDP.
On a machine with few cores the ranks, their communication threads and backward share the
cores, so the numbers measure that contention as much as the network.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from ringreduce.launch import free_port

MODES = ("compute", "flat", "gradsync", "gradsync-plain", "ddp", "ddp-rr")


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
    import ringreduce.torch  # noqa: F401 (registers the torch.distributed backend)

    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    # MASTER_ADDR names rank 0's host when ranks run on several (emulated) hosts,
    # e.g. network namespaces from bench/netns_hosts.sh; set GLOO_SOCKET_IFNAME there.
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if addr.startswith("127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    comm = rr.init(
        args.transport, rank=rank, world_size=world, master_addr=addr, master_port=rr_port
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{gloo_port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = build_model(args.width, args.depth)
    # DDP hooks every parameter it wraps: it gets a replica of its own, so that its
    # hooks never fire in the other modes.
    ddp = torch.nn.parallel.DistributedDataParallel(
        copy.deepcopy(model),
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=args.grad_views,
    )
    ddp_rr = torch.nn.parallel.DistributedDataParallel(
        copy.deepcopy(model),
        process_group=dist.new_group(backend="ringreduce"),
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=args.grad_views,
    )
    n_params = sum(p.numel() for p in model.parameters())
    x = torch.randn(args.batch, args.width)
    loss_fn = torch.nn.MSELoss()
    target = torch.randn(args.batch, args.width)

    def compute(net: Any) -> None:
        if args.grad_views:
            net.zero_grad(set_to_none=False)  # gradients stay where they are (bucket views)
        else:
            for p in net.parameters():
                p.grad = None
        loss_fn(net(x), target).backward()

    def gradsync(net: Any, **compression: Any) -> Any:
        return rr.torch.GradSync(
            net,
            comm,
            bucket_mb=args.bucket_mb,
            first_bucket_mb=args.first_bucket_mb,
            gradient_as_bucket_view=args.grad_views,
            **compression,
        )

    modes = MODES + ((f"gradsync-{args.compression}",) if args.compression else ())
    runs: list[np.ndarray] = []

    # GradSync, like DDP, gets a replica of its own, made once: its hooks never fire in
    # the other modes, and it lives across runs as it does in training.
    syncs: dict[str, tuple[Any, Any]] = {}
    for name, compression in [("gradsync", {}), ("gradsync-plain", {"windows": False})] + (
        [(modes[-1], {"compression": args.compression, "error_feedback": True})]
        if args.compression
        else []
    ):
        replica = copy.deepcopy(model)
        syncs[name] = (replica, gradsync(replica, **compression))

    # One training step of each mode.
    steps: dict[str, Callable[[], Any]] = {
        "compute": lambda: compute(model),
        "flat": lambda: (compute(model), flat_all_reduce(model, comm)),
        "ddp": lambda: compute(ddp),
        "ddp-rr": lambda: compute(ddp_rr),
    }
    for name, (replica, sync) in syncs.items():
        steps[name] = lambda replica=replica, sync=sync: (compute(replica), sync.wait())
    for run in range(args.runs):
        # Each run starts at another mode (the same on every rank), so that no mode is
        # always timed right after the same other one: what a mode leaves behind (freed
        # gradients, the allocator's state, a busy engine) then weighs on all alike.
        results: dict[str, list[float]] = {}
        for name in modes[run % len(modes) :] + modes[: run % len(modes)]:
            results[name] = timed_steps(steps[name], comm, args.warmup, args.steps)
        # The job is as slow as its slowest rank.
        medians = np.array([statistics.median(results[m]) for m in modes])
        runs.append(comm.all_reduce(medians, op="max"))

    sync = syncs["gradsync"][1]
    buckets, summary = len(sync.bucketer.plan), sync.summary()
    alternated = alternate(args, comm, steps)
    if rank == 0:
        report(runs, world, n_params, args, torch.get_num_threads(), buckets, summary, comm, modes)
        if alternated is not None:
            c, g, d = alternated
            print(
                f"Alternating step by step ({args.alternate} rounds, one step of each mode "
                f"per round): compute {c * 1e3:.1f} ms, GradSync {g * 1e3:.1f} ms "
                f"({g / c:.2f}x), DDP on ringreduce {d * 1e3:.1f} ms ({d / c:.2f}x)"
            )
    dist.destroy_process_group()
    comm.close()


def alternate(args: argparse.Namespace, comm: Any, steps: dict) -> Any:
    """With --alternate K: K rounds of one step each of compute, GradSync and DDP on the
    ringreduce backend (the order reversed every other round), so that the two systems
    meet the same machine state step by step; the median seconds of each (slowest rank),
    or None."""
    import numpy as np

    if not args.alternate:
        return None
    steps = {name: steps[name] for name in ("compute", "gradsync", "ddp-rr")}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for k in range(args.alternate + 2):  # the first two rounds warm up
        for name in list(steps)[:: 1 if k % 2 else -1]:
            comm.barrier()
            start = time.perf_counter()
            steps[name]()
            if k >= 2:
                times[name].append(time.perf_counter() - start)
    medians = np.array([statistics.median(times[name]) for name in steps])
    return tuple(comm.all_reduce(medians, op="max"))


def report(
    runs: list,
    world: int,
    n_params: int,
    args: argparse.Namespace,
    threads: int,
    buckets: int,
    summary: dict,
    comm: Any,
    modes: tuple,
) -> None:
    """Prints the table: per mode, the median step and exposed time over the runs."""
    print(
        f"{world} ranks over {comm.transport}, {n_params / 1e6:.1f} M parameters "
        f"({n_params * 4 / 1e6:.0f} MB float32 gradients), batch {args.batch}/rank, "
        f"{threads} threads/rank, {buckets} buckets; {len(runs)} runs of {args.steps} steps"
    )
    print("| mode | step (ms) | step / compute | exposed comm (ms) | exposed fraction of step |")
    print("|---|---:|---:|---:|---:|")
    exposed = {m: [max(r[i] - r[0], 0.0) for r in runs] for i, m in enumerate(modes)}
    for i, mode in enumerate(modes):
        steps = [r[i] for r in runs]
        ratio = [r[i] / r[0] for r in runs]
        step = statistics.median(steps)
        hidden = statistics.median(exposed[mode]) if mode != "compute" else 0.0
        print(
            f"| {mode} | {step * 1e3:.1f} [{min(steps) * 1e3:.1f}..{max(steps) * 1e3:.1f}] "
            f"| {statistics.median(ratio):.2f} | {hidden * 1e3:.1f} | {hidden / step:.1%} |"
        )
    ours, gloo = modes.index("ddp-rr"), modes.index("ddp")
    backend = [r[ours] / r[gloo] for r in runs]
    print(
        f"DDP step on the ringreduce backend / on Gloo: {statistics.median(backend):.2f} "
        f"[{min(backend):.2f}..{max(backend):.2f}]"
    )
    ahead = sum(g <= d for g, d in zip(exposed["gradsync"], exposed["ddp"]))
    print(
        f"GradSync exposed no more communication than DDP in {ahead} of {len(runs)} runs; "
        f"its own count: {summary['comm_s'] / max(summary['steps'], 1) * 1e3:.1f} ms of "
        f"all-reduce per step, {summary['exposed_fraction']:.1%} of it exposed in wait()"
    )


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
    parser.add_argument("--runs", type=int, default=3, help="runs of every mode, interleaved")
    parser.add_argument(
        "--grad-views",
        action="store_true",
        help="gradients as bucket views (GradSync and DDP), zeroed in place each step",
    )
    parser.add_argument("--transport", default="auto", help="ringreduce transport (default: auto)")
    parser.add_argument(
        "--compression", help="also time GradSync with this codec (bf16, int8) and error feedback"
    )
    parser.add_argument(
        "--alternate",
        type=int,
        default=0,
        metavar="K",
        help="then K rounds alternating compute, GradSync and DDP on ringreduce step by step",
    )
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
