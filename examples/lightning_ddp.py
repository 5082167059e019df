"""PyTorch Lightning on the ringreduce backend: ``DDPStrategy(process_group_backend=...)``.

    ringreduce launch -n 2 -- python examples/lightning_ddp.py
    torchrun --nproc-per-node 2 examples/lightning_ddp.py
    mpirun -n 2 python examples/lightning_ddp.py
    python examples/lightning_ddp.py --backend gloo      # the same run on Gloo

A LightningModule (an MLP classifying points of two interleaved spirals) trains with
Lightning's ``Trainer`` and its DDP strategy; the only ringreduce-specific lines are the
import that registers the backend, ``rr.torch.init_process_group``, which meets the other
ranks whichever launcher started them (Lightning finds the group made and uses it), and
the backend's name in ``DDPStrategy``. ``--save PATH`` writes rank 0's final weights, so
that two runs (ringreduce and gloo) can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
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


class Classifier(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 2),
        )

    def training_step(self, batch: tuple, _index: int) -> torch.Tensor:
        xy, label = batch
        return torch.nn.functional.cross_entropy(self.net(xy), label)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ringreduce")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="points per rank per step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--save", help="write rank 0's final weights (torch.save) here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    # Lightning would make the group itself under ringreduce launch or torchrun; made
    # here it also runs under mpirun and srun, and Lightning uses the group it finds.
    rr.torch.init_process_group(args.backend)
    world, local = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # a tiny dataset

    L.seed_everything(0, verbose=False)  # every replica starts from the same weights
    model = Classifier(args.lr)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=local,
        num_nodes=world // local,
        strategy=DDPStrategy(process_group_backend=args.backend),
        max_epochs=args.epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    # Lightning shards the data over the ranks (a DistributedSampler) by itself.
    start = time.perf_counter()
    trainer.fit(model, DataLoader(spirals(4096, 1), batch_size=args.batch, shuffle=True))
    seconds = time.perf_counter() - start

    test = spirals(1024, 2)
    with torch.no_grad():
        accuracy = (model.net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(every[0], e) for e in every)
    if trainer.global_rank == 0:
        print(
            f"{world} ranks on {dist.get_backend()}: test accuracy {float(accuracy):.3f}, "
            f"replicas identical: {same}; fit {seconds:.2f} s"
        )
        if args.save:
            torch.save(model.state_dict(), args.save)
    if not same:
        raise SystemExit("replicas differ")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
