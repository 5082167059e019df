"""One rank of a torch.distributed job on "ringreduce" that loses a rank and goes on with
``dist.shrink_group`` (tests/test_torch_shrink.py):

    python _torch_shrink_rank.py SIZE LINKS VICTIM SCENARIO

forks SIZE ranks (torch is imported once, before) and prints one JSON line: each rank's
exit code and each survivor's report. LINKS "tcp" (every rank its own emulated host) or
"shm". Rank VICTIM kills itself (SIGKILL).
SCENARIO "collective": all_reduce until the victim dies; the survivors check the error,
shrink, and run collectives on the new group. "ddp": DDP trains; the victim dies in
step 3's backward; the survivors shrink, rebuild DDP over the new default group, redo
the step among themselves and train on.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

STEPS, KILL_STEP, BATCH = 6, 3, 16


def collective(rank: int, size: int, victim: int) -> dict:
    old = dist.group.WORLD
    x = torch.ones(1 << 15)
    start = time.monotonic()
    seen: dict = {}
    while True:
        if rank == victim and time.monotonic() - start > 0.3:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(x)
        except Exception as exc:  # noqa: BLE001 - what the survivor saw is the result
            seen.update(error=type(exc).__name__, failed=sorted(getattr(exc, "failed", ())))
            break
        x.fill_(1)
        if time.monotonic() - start > 30:
            return {"error": None}
    seen["revoked"] = old.comm.revoked
    again = time.monotonic()
    try:  # a rank that keeps calling gets the error again, at once
        dist.all_reduce(x)
        seen["again"] = "ran"
    except Exception as exc:  # noqa: BLE001
        seen["again"] = [type(exc).__name__, round(time.monotonic() - again, 3)]
    t0 = time.monotonic()
    new = dist.shrink_group([victim])
    seen["shrink_s"] = time.monotonic() - t0
    survivors = [r for r in range(size) if r != victim]
    seen.update(
        default=new is dist.group.WORLD,
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        backend=dist.get_backend(),
        type=type(new).__name__,
    )
    v = torch.arange(1000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(v)
    want = np.arange(1000, dtype=np.float64) * sum(r + 1 for r in survivors)
    seen["sum_ok"] = bool(np.array_equal(v.numpy(), want))
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in survivors]
    dist.all_gather(gathered, torch.tensor([rank]))
    seen["gathered"] = [int(g) for g in gathered]
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=0)
    seen["bcast"] = float(b)
    try:  # the old group was destroyed by shrink_group: a clean error, no hang
        old.allreduce([torch.ones(3)]).wait()
        seen["old"] = "ran"
    except Exception as exc:  # noqa: BLE001
        seen["old"] = type(exc).__name__
    old.abort()  # never kills the process
    return seen


def shard(r: int, step: int) -> tuple:
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()


def reference(size: int, victim: int) -> list:
    """One process: each step's gradient averaged over the live ranks' micro-batches."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(STEPS):
        live = [r for r in range(size) if r != victim or step < KILL_STEP]
        opt.zero_grad()
        for r in live:
            x, y = shard(r, step)
            (torch.nn.functional.mse_loss(net(x), y) / len(live)).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def ddp(rank: int, size: int, victim: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    wrapped = DDP(net)
    seen: dict = {"errors": []}
    step = 0
    while step < STEPS:
        x, y = shard(rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(wrapped(x), y)
        if rank == victim and step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - the survivor goes on
            seen["errors"].append([step, type(exc).__name__])
            t0 = time.monotonic()
            dist.shrink_group([victim])
            seen["shrink_s"] = time.monotonic() - t0
            wrapped = DDP(net)  # over the new default group
            continue  # the same step again, among the survivors
        opt.step()
        step += 1
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    replicas = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, flat)
    seen["identical"] = all(torch.equal(r, flat) for r in replicas)
    want = torch.cat([p.reshape(-1) for p in reference(size, victim)])
    seen["vs_reference"] = float((flat - want).abs().max())
    seen["size"] = dist.get_world_size()
    return seen


def rank_main(
    rank: int, size: int, port: int, links: str, victim: int, scenario: str, conn
) -> None:
    if links == "tcp":
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank}"
    torch.set_num_threads(1)  # the ranks share two cores
    timeout = datetime.timedelta(seconds=20)
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timeout)
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=size, timeout=timeout)
    report = (collective if scenario == "collective" else ddp)(rank, size, victim)
    report["transport"] = dist.group.WORLD.comm.transport
    dist.destroy_process_group()
    conn.send(report)


def main() -> None:
    """Forks the ranks (torch imported once, here), waits for them (60 s at most) and
    prints {"exit": [exit code by rank], "reports": {rank: report}}."""
    size, links, victim, scenario = sys.argv[1:5]
    size, victim = int(size), int(victim)
    port = free_port()
    fork = mp.get_context("fork")
    procs, conns = [], []
    for r in range(size):
        parent, child = fork.Pipe(duplex=False)
        args = (r, size, port, links, victim, scenario, child)
        procs.append(fork.Process(target=rank_main, args=args))
        procs[-1].start()
        conns.append(parent)
    deadline = time.monotonic() + 60
    reports = {}
    for r, (p, conn) in enumerate(zip(procs, conns)):
        if conn.poll(max(0.0, deadline - time.monotonic())):
            try:
                reports[r] = conn.recv()
            except EOFError:
                pass  # died without a report: the victim
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    print(json.dumps({"exit": [p.exitcode for p in procs], "reports": reports}), flush=True)


if __name__ == "__main__":
    import multiprocessing as mp

    import numpy as np
    import torch
    import torch.distributed as dist

    import ringreduce.torch  # noqa: F401 (registers the backend)

    from _ranks import free_port

    main()
