"""Fault-tolerant data parallelism with torchft, ringreduce carrying the all-reduce.

torchft (``pip install torchft``) lets replica groups die and come back while the
others train on: a Lighthouse decides which groups take part in each step, and a
group that restarts heals, fetching the weights and optimizer state from a live one.
Here each replica group is one process, and `ProcessGroupRingReduceFT` carries the
gradient all-reduce between the groups (and the checkpoint a healing group fetches).

    pip install torchft
    RUST_BACKTRACE=1 torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 \\
        --join_timeout_ms 10000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510
    REPLICA_GROUP_ID=0 python examples/torchft_ddp.py &
    REPLICA_GROUP_ID=1 python examples/torchft_ddp.py --fail-at-step 300
    REPLICA_GROUP_ID=1 python examples/torchft_ddp.py     # back: heals from group 0

Group 1 joins group 0 (healing from it: group 0 started first), then dies (SIGKILL)
in the middle of step 300: group 0's all-reduce of that step fails at once, torchft
drops the step, and group 0 trains on alone once the Lighthouse has given up on
group 1 (no heartbeat for 5 s), until group 1 is back. torchft's own way to start a
group, torchrun, works too (it hosts the group's store; alone, the script does):

    REPLICA_GROUP_ID=0 torchrun --nproc-per-node 1 --master-port 29600 examples/torchft_ddp.py

An MLP learns to classify points of two interleaved spirals; each group draws its
own batches. At the end each group prints a checksum of its parameters: every group
that finished the same step has the same one, to the bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import time
from datetime import timedelta

import torch
import torchft
from torch.distributed import TCPStore
from torchft.checkpointing.pg_transport import PGTransport

from ringreduce.torchft import ProcessGroupRingReduceFT

STARTED = time.time()


def spirals(n: int, seed: int) -> tuple:
    """n points on two interleaved spirals, with noise; label = which spiral."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi + 0.5
    label = torch.randint(0, 2, (n,), generator=g)
    sign = 1 - 2 * label.float()
    xy = torch.stack([t * torch.cos(t) * sign, t * torch.sin(t) * sign], dim=1) / 10
    return xy + 0.03 * torch.randn(n, 2, generator=g), label


def checksum(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="train until this step")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective, a quorum or a heal may take",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=-1,
        metavar="K",
        help="SIGKILL this process in the middle of step K's backward",
    )
    parser.add_argument(
        "--save", metavar="DIR", help="write the final weights and a summary (json) there"
    )
    args = parser.parse_args()

    if not os.environ.get("TORCHFT_LIGHTHOUSE"):
        parser.error(
            "TORCHFT_LIGHTHOUSE is not set: start a Lighthouse (torchft_lighthouse "
            "--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 &) and export "
            "TORCHFT_LIGHTHOUSE=http://localhost:29510 (see this file's docstring)"
        )
    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=args.timeout)
    if "MASTER_PORT" in os.environ:  # torchrun: the group's store is there
        store = None
        where = {}
    else:  # a group of one process: it hosts the store itself
        store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
        where = dict(store_addr="localhost", store_port=store.port, rank=0, world_size=1)

    torch.manual_seed(group)  # different on purpose: torchft syncs the weights at step 0
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 2),
    )
    inner = torch.optim.Adam(model.parameters(), lr=0.01)

    pg = ProcessGroupRingReduceFT(timeout=timeout)
    manager = torchft.Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=lambda sd: (
            model.load_state_dict(sd["model"]),
            inner.load_state_dict(sd["optim"]),
        ),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"torchft_ddp_{group}",
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
        **where,
    )
    ddp = torchft.DistributedDataParallel(manager, model)
    optimizer = torchft.Optimizer(manager, inner)
    xy, label = spirals(4096, seed=1)

    tried = committed = 0
    healed, dropped = None, []
    loss = torch.zeros(())
    while manager.current_step() < args.steps:
        step = manager.current_step()
        g = torch.Generator().manual_seed(1_000_003 * group + step)
        batch = torch.randint(0, len(xy), (args.batch,), generator=g)
        optimizer.zero_grad()  # starts this step's quorum
        loss = torch.nn.functional.cross_entropy(ddp(xy[batch]), label[batch])
        if step == args.fail_at_step:
            # Once this step's quorum is formed, the others wait for this process's
            # gradients: it dies before they are ready (a tensor hook runs first).
            manager.wait_quorum()
            model[0].weight.register_hook(lambda _: os.kill(os.getpid(), signal.SIGKILL))
        loss.backward()  # the gradients' all-reduce runs on ringreduce
        optimizer.step()  # only if every group's all-reduce succeeded
        tried += 1
        if manager.current_step() > step:
            committed += 1
        else:  # a group failed during it: torchft drops the step, and retries it
            dropped.append({"step": step, "at": time.time()})
            why = getattr(manager.errored(), "original_exception", "too few groups")
            print(f"[group {group}] step {step} dropped: {why}", flush=True)
        if manager.current_step() > step + 1:  # fetched from a live group
            healed = {"step": manager.current_step() - 1, "at": time.time()}
            print(
                f"[group {group}] healed: joined at step {healed['step']}, "
                f"{healed['at'] - STARTED:.2f} s after starting",
                flush=True,
            )

    digest = checksum(model)
    print(
        f"[group {group}] step {manager.current_step()}: {committed} steps committed "
        f"of {tried} tried; loss {loss.item():.4f}; parameters sha256 {digest[:16]}",
        flush=True,
    )
    if args.save:
        torch.save(model.state_dict(), os.path.join(args.save, f"group{group}.pt"))
        summary = dict(
            group=group,
            step=manager.current_step(),
            committed=committed,
            tried=tried,
            healed=healed,
            dropped=dropped,
            started=STARTED,
            sha256=digest,
        )
        with open(os.path.join(args.save, f"group{group}.json"), "w") as f:
            json.dump(summary, f)
    manager.shutdown(wait=False)
    pg.shutdown()
    del store  # the group's store, if this process hosts it: needed until here


if __name__ == "__main__":
    main()
