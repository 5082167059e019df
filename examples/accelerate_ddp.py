"""Hugging Face Accelerate on the ringreduce backend.

    ringreduce launch -n 2 -- python examples/accelerate_ddp.py
    torchrun --nproc-per-node 2 examples/accelerate_ddp.py
    mpirun -n 2 python examples/accelerate_ddp.py
    python examples/accelerate_ddp.py --backend gloo     # the same run on Gloo

Accelerate chooses its CPU backend from a list of its own (gloo or mpi) and refuses any
other name, but it uses a process group that is already initialised. So the recipe is
one line before the ``Accelerator``: ``rr.torch.init_process_group()`` (which also works
under mpirun and srun). Accelerate then reports ``state.backend == "gloo"``, its name for
any CPU group, while ``torch.distributed.get_backend()`` says "ringreduce": every
collective it issues (DDP's gradient all-reduce and ``broadcast``, ``gather``) runs on
ringreduce. Use a launcher other than ``accelerate launch --cpu``, which starts one
process.

An MLP learns to classify points of two interleaved spirals; ``--save PATH`` writes
rank 0's final weights, so that two runs (ringreduce and gloo) can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

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
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="points per rank per step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--save", help="write rank 0's final weights (torch.save) here")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else Accelerate picks and warns
    torch.set_num_threads(1)
    rr.torch.init_process_group(args.backend)  # before the Accelerator, which then uses it
    accelerator = Accelerator(cpu=True)

    set_seed(0)  # every replica starts from the same weights
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 2),
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(spirals(4096, 1), batch_size=args.batch, shuffle=True)
    # Accelerate wraps the model in DDP and gives each rank its share of every epoch.
    model, opt, loader = accelerator.prepare(model, opt, loader)

    start = time.perf_counter()
    steps = 0
    for _ in range(args.epochs):
        for xy, label in loader:
            opt.zero_grad()
            accelerator.backward(torch.nn.functional.cross_entropy(model(xy), label))
            opt.step()
            steps += 1
    seconds = time.perf_counter() - start

    net = accelerator.unwrap_model(model)
    test = spirals(1024, 2)
    with torch.no_grad():
        accuracy = (net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    # torch.distributed.all_gather into tensors this function holds until the group has
    # ended, not accelerator.gather: that one gathers into temporaries that Gloo's worker
    # thread may be the last to release, and a thread that needs the GIL to free a tensor
    # while the interpreter exits aborts the process ("terminate called without an active
    # exception", torch's AsyncAllgatherWork destructor).
    every = [torch.empty_like(flat) for _ in range(accelerator.num_processes)]
    dist.all_gather(every, flat)  # one row per rank
    same = all(torch.equal(every[0], row) for row in every)
    if accelerator.is_main_process:
        print(
            f"{accelerator.num_processes} ranks on {dist.get_backend()} (Accelerate's label: "
            f"{accelerator.state.backend}): test accuracy {float(accuracy):.3f}, replicas "
            f"identical: {same}; {steps} steps in {seconds:.2f} s"
        )
        if args.save:
            torch.save(net.state_dict(), args.save)
    if not same:
        raise SystemExit("replicas differ")
    accelerator.end_training()  # also ends the process group
    del flat, every


if __name__ == "__main__":
    main()
