"""Data-parallel training of a small torch model with rr.torch.GradSync.

    ringreduce launch -n 2 -- python examples/torch_gradsync.py
    python examples/torch_gradsync.py            # alone: a world of one

A convolutional classifier learns to tell two kinds of random 8x8 images apart (bright
bars, horizontal or vertical, in noise). Every rank holds a replica, starts from rank 0's
weights (``broadcast_parameters``) and trains on its own slice of each global batch; the
GradSync hooks hand each gradient to a bucket as soon as backward produces it, so the
all-reduce of the last layers overlaps the backward of the first. After ``sync.wait()``
every ``.grad`` holds the average over ranks, the replicas take the same step and stay
identical, which rank 0 checks at the end along with the accuracy.
"""

from __future__ import annotations

import argparse

import torch

import ringreduce as rr


def make_batch(step: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's global batch; every rank builds it and keeps its own rows."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    labels = torch.randint(0, 2, (rows,), generator=g)
    images = 0.3 * torch.randn(rows, 1, 8, 8, generator=g)
    where = torch.randint(0, 8, (rows,), generator=g)
    for i in range(rows):
        if labels[i]:
            images[i, 0, :, where[i]] += 1.0  # a vertical bar
        else:
            images[i, 0, where[i], :] += 1.0  # a horizontal bar
    return images, labels


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    comm = rr.init()
    rank, world = comm.rank, comm.world_size
    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcast fixes it
    model = make_model()
    rr.torch.broadcast_parameters(model, comm, root=0)
    sync = rr.torch.GradSync(model, comm, bucket_mb=0.01, first_bucket_mb=0.002)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"world_size {world} ({comm.transport}), batch {args.batch} per rank, "
            f"{n_params} parameters in {len(sync.bucketer.plan)} buckets"
        )
    for step in range(args.steps):
        images, labels = make_batch(step, world * args.batch, args.seed)
        opt.zero_grad()
        loss = loss_fn(model(images[mine]), labels[mine])
        loss.backward()  # GradSync launches bucket all-reduces from its hooks
        sync.wait()  # every .grad now holds the average over ranks
        opt.step()
        mean_loss = comm.all_reduce(loss.detach().reshape(1), op="avg")[0]
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {float(mean_loss):.4f}")

    images, labels = make_batch(10_000, 512, args.seed)
    with torch.no_grad():
        accuracy = float((model(images).argmax(1) == labels).float().mean())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = comm.all_gather(flat)
    identical = all(torch.equal(every[0], every[r]) for r in range(world))
    if rank == 0:
        print(f"held-out accuracy {accuracy:.3f}; replicas identical: {identical}")
    comm.close()
    if not identical:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
