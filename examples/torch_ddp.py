"""PyTorch DDP on the ringreduce backend: one word changes from a Gloo or NCCL script.

    ringreduce launch -n 2 -- python examples/torch_ddp.py
    torchrun --nproc-per-node 2 examples/torch_ddp.py
    mpirun -n 2 python examples/torch_ddp.py      # srun -n 2 too
    python examples/torch_ddp.py                  # alone: a world of one
    python examples/torch_ddp.py --backend gloo   # the same run on Gloo, to compare

``rr.torch.init_process_group()`` reads the rank and world size from whichever launcher
started the process (torch's own ``env://`` knows only torchrun's variables), so the
script runs as it is under every one of them.

An MLP learns to classify points of two interleaved spirals. The dataset is split over
the ranks by ``DistributedSampler``; ``DistributedDataParallel`` averages the gradients
with ringreduce's all-reduce while backward runs, and broadcasts rank 0's initial weights.
At the end every rank all-gathers a checksum of its parameters: the replicas must be
identical, and rank 0 prints the test accuracy.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ringreduce as rr
import ringreduce.torch  # noqa: F401  (rr.torch; registers backend "ringreduce")


def spirals(n: int, seed: int) -> TensorDataset:
    """n points on two interleaved spirals, with noise; label = which spiral."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi + 0.5
    label = torch.randint(0, 2, (n,), generator=g)
    sign = 1 - 2 * label.float()
    xy = torch.stack([t * torch.cos(t) * sign, t * torch.sin(t) * sign], dim=1) / 10
    return TensorDataset(xy + 0.03 * torch.randn(n, 2, generator=g), label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ringreduce")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="points per rank per step")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.set_num_threads(1)
    rr.torch.init_process_group(args.backend)  # any launcher, or none
    rank, world = dist.get_rank(), dist.get_world_size()

    train, test = spirals(4096, seed=1), spirals(1024, seed=2)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)

    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's weights
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 2),
    )
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{world} ranks on {dist.get_backend()}, {len(loader)} steps an epoch")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)  # this rank's summed loss and steps this epoch
        for xy, label in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xy), label)
            loss.backward()  # DDP all-reduces the gradients while backward runs
            opt.step()
            total += torch.stack([loss.detach(), torch.ones(())])
        dist.all_reduce(total)  # over every rank: the epoch's mean loss
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {float(total[0] / total[1]):.4f}")

    with torch.no_grad():
        accuracy = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
        checksum = torch.cat([p.reshape(-1) for p in model.parameters()]).double().sum()
    sums = [torch.zeros(()) for _ in range(world)]
    dist.all_gather(sums, checksum.float())
    if rank == 0:
        same = all(bool(s == sums[0]) for s in sums)
        print(f"test accuracy {accuracy:.3f}; replicas identical: {same}")
        if not same:
            raise SystemExit("replicas differ")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
