"""One rank of a torch GradSync(fault_tolerant=True) job (tests/test_bucketing_ft.py):

    python _ft_gradsync_rank.py RANK SIZE PORT TRANSPORT VICTIM STEPS

A float64 MLP trains with SGD on micro-batches that depend on (rank, step). In step 1 the
victim dies in the middle of backward, once the last layers' buckets are on the wire;
the survivors' step finishes with their own average. Prints the final weights as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

LR = 0.05


def model_and_data():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 1),
    ).double()
    return net


def batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    rank, size, port, transport, victim, steps = sys.argv[1:7]
    rank, size, victim, steps = int(rank), int(size), int(victim), int(steps)
    comm = rr.init(
        transport,
        rank=rank,
        world_size=size,
        master_addr="127.0.0.1",
        master_port=int(port),
        timeout=20,
    )
    net = model_and_data()
    changes = []
    step_now = [0]

    # Registered before GradSync's hooks, so it runs first: the victim dies with the
    # later layers' buckets on the wire and the first layer's never sent.
    def die_late(param):  # the first layer's gradient comes last in backward
        if rank == victim and step_now[0] == 1:
            time.sleep(0.2)  # the later layers' buckets are on the wire
            os.kill(os.getpid(), signal.SIGKILL)

    net[0].weight.register_post_accumulate_grad_hook(die_late)
    sync = rr.torch.GradSync(
        net,
        comm,
        bucket_mb=1e-3,
        first_bucket_mb=1e-3,
        fault_tolerant=True,
        on_membership_change=lambda c: changes.append(c.world_size),
    )
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        step_now[0] = step
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(net(x), y).backward()
        sync.wait()
        opt.step()
        opt.zero_grad()
    weights = [p.detach().reshape(-1).tolist() for p in net.parameters()]
    print(json.dumps({"rank": rank, "weights": weights, "changes": changes}), flush=True)


if __name__ == "__main__":
    import torch

    import ringreduce as rr
    import ringreduce.torch  # noqa: F401

    main()
