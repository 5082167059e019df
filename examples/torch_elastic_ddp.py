"""DDP on the "ringreduce" backend that survives a dead rank: 4 ranks train a small MLP;
one is killed (SIGKILL) in the middle of a step; the survivors agree on who died,
``dist.shrink_group([dead])``, rebuild DDP over the shrunk default group, redo that step
among themselves (only the dead rank's micro-batch is lost) and finish, with replicas
bitwise identical (asserted). No restart, no checkpoint.

    python examples/torch_elastic_ddp.py                  # launches its own 4 ranks
    python examples/torch_elastic_ddp.py --kill-rank 0    # the host of torch's store

It starts its ranks itself (forks of one process) and they meet on a TCPStore at
127.0.0.1; under a launcher, ``train`` is what each rank runs.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import signal
import socket
import sys
import time

STEPS, BATCH = 10, 32


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=4)
    return p.parse_args()


def launch(args: argparse.Namespace) -> int:
    """Starts the ranks, waits for them (60 s at most) and checks how each ended. They
    are forks of this process, which has imported torch once for all of them."""
    import multiprocessing as mp

    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import ringreduce.torch  # noqa: F401

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        args.port = s.getsockname()[1]
    fork = mp.get_context("fork")
    procs = []
    for r in range(args.world):
        args.rank = r
        procs.append(fork.Process(target=train, args=(argparse.Namespace(**vars(args)),)))
        procs[-1].start()
    deadline = time.monotonic() + 60
    ok = True
    for r, p in enumerate(procs):
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
        want = -signal.SIGKILL if r == args.kill_rank else 0
        if p.exitcode != want:
            print(f"rank {r} ended with {p.exitcode}, expected {want}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringreduce.torch  # noqa: F401 (registers the "ringreduce" backend)

    torch.set_num_threads(1)  # the ranks share this host's cores
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", args.port, args.world, args.rank == 0, timeout=timeout)
    dist.init_process_group(
        "ringreduce", store=store, rank=args.rank, world_size=args.world, timeout=timeout
    )
    torch.manual_seed(0)  # the same initial weights on every rank
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    ).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = DDP(net)
    step = 0
    while step < STEPS:
        # This rank's micro-batch of the step: its shard is its rank at the start.
        g = torch.Generator().manual_seed(1000 * step + args.rank)
        x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)  # as an out-of-memory kill would
        try:
            loss.backward()  # DDP all-reduces the gradients here
        except RuntimeError:
            # A rank died. No survivor finished this step's all-reduce (the dead rank
            # never sent its part); but a survivor may not have finished the previous
            # step's, which the dead rank did finish (a collective can end on the ranks
            # that had all they needed, and fail on the others): it failed there and is
            # a step behind. DDP(net) below gives every survivor rank 0's weights, and
            # the broadcast after it rank 0's step, so they all go on from one state.
            world = dist.group.WORLD
            world.comm.agree()  # every survivor now knows the same dead ranks
            dead = sorted(world.comm.failed_ranks)
            start = time.monotonic()
            dist.shrink_group(dead)  # the new default group: the survivors, renumbered
            took = time.monotonic() - start
            model = DDP(net)  # over the shrunk group; syncs from its rank 0
            at = torch.tensor([step])
            dist.broadcast(at, src=0)
            step = int(at.item())  # rank 0's: the step its weights are at
            if dist.get_rank() == 0:
                print(
                    f"step {step}: rank(s) {dead} died; shrink_group took {took * 1e3:.0f} ms; "
                    f"going on with {dist.get_world_size()} ranks",
                    flush=True,
                )
            continue  # that step again, among the survivors
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.6f} on rank 0's micro-batch", flush=True)
        step += 1
    # Every survivor holds the same weights, bit for bit.
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, flat)
    assert all(torch.equal(r, flat) for r in replicas), "replicas differ"
    if dist.get_rank() == 0:
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
        print(f"replicas identical on {dist.get_world_size()} survivors: {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(launch(parse()))
