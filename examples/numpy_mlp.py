"""Data-parallel training of a float64 MLP in plain numpy, with gradient bucketing.

    ringreduce launch -n 4 -- python examples/numpy_mlp.py
    python examples/numpy_mlp.py            # alone: a world of one

Every rank holds a full replica and trains on its own slice of each global batch. The
hand-written backward hands each gradient to the GradientBucketer the moment it is
computed, last layer first, so the all-reduce of the last layers runs while the earlier
layers are still being differentiated. After ``wait()`` every rank holds the same averaged
gradient, so the replicas stay identical and N ranks with batch b train exactly like one
process with batch N x b; rank 0 checks both at the end.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

import ringreduce as rr


def init_params(sizes: list[int], seed: int) -> list[np.ndarray]:
    """[W0, b0, W1, b1, ...] in model order, the same on every rank (same seed)."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append(rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))
        params.append(np.zeros(fan_out))
    return params


def global_batch(step: int, rows: int, sizes: list[int], seed: int):
    """Step's global batch: inputs and the targets of a fixed random 'teacher' network.

    Every rank builds the whole batch and keeps its own rows, so the data of a run with N
    ranks is exactly the data of one process with N times the batch.
    """
    teacher = np.random.default_rng(seed + 1).standard_normal((sizes[0], sizes[-1]))
    teacher /= np.sqrt(sizes[0])
    x = np.random.default_rng([seed, step]).standard_normal((rows, sizes[0]))
    return x, np.sin(x @ teacher)


def loss_and_grads(
    params: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    on_grad: Callable[[int, np.ndarray], None] | None = None,
):
    """Loss 0.5 * mean |out - y|^2 (tanh hidden layers) and its gradients in model order.

    ``on_grad(index, grad)`` is called as each gradient is finished, last layer first:
    the backward hook of this hand-written framework.
    """
    n_layers = len(params) // 2
    acts = [x]
    for layer in range(n_layers):
        z = acts[-1] @ params[2 * layer] + params[2 * layer + 1]
        acts.append(np.tanh(z) if layer < n_layers - 1 else z)
    err = acts[-1] - y
    loss = 0.5 * float((err**2).sum()) / x.shape[0]
    delta = err / x.shape[0]
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    for layer in reversed(range(n_layers)):
        grads[2 * layer + 1] = delta.sum(axis=0)
        grads[2 * layer] = acts[layer].T @ delta
        if on_grad is not None:
            on_grad(2 * layer + 1, grads[2 * layer + 1])
            on_grad(2 * layer, grads[2 * layer])
        if layer:
            delta = (delta @ params[2 * layer].T) * (1.0 - acts[layer] ** 2)
    return loss, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="rows per rank per step")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256, 256, 8])
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--bucket-mb", type=float, default=0.25)
    parser.add_argument("--first-bucket-mb", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", help="write this rank's chrome trace to TRACE.rank<r>.json")
    args = parser.parse_args()

    comm = rr.init()
    rank, world = comm.rank, comm.world_size
    params = init_params(args.sizes, args.seed)
    bucketer = rr.GradientBucketer(
        comm, bucket_mb=args.bucket_mb, first_bucket_mb=args.first_bucket_mb
    )
    handles = [
        bucketer.register(f"{'Wb'[i % 2]}{i // 2}", p.shape, p.dtype) for i, p in enumerate(params)
    ]
    if rank == 0:
        print(
            f"world_size {world}, batch {args.batch} per rank, "
            f"{sum(p.size for p in params)} parameters in {len(bucketer.plan)} buckets"
        )
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    for step in range(args.steps):
        x, y = global_batch(step, world * args.batch, args.sizes, args.seed)
        loss, grads = loss_and_grads(
            params, x[mine], y[mine], on_grad=lambda i, g: bucketer.ready(handles[i], g)
        )
        bucketer.wait()  # grads now hold the average over all ranks
        for p, g in zip(params, grads):
            p -= args.lr * g
        # The global loss is the mean of the ranks' losses (equal batch per rank).
        global_loss = comm.all_reduce(np.array([loss]), op="avg")[0]
        if rank == 0:
            print(f"step {step:3d}  loss {global_loss:.6f}")

    # Replicas must be bitwise identical: compare every rank's parameters with rank 0's.
    flat = np.concatenate([p.ravel() for p in params])
    gathered = comm.all_gather(flat)
    identical = all(np.array_equal(gathered[0], gathered[r]) for r in range(world))
    if args.trace:
        bucketer.save_trace(f"{args.trace}.rank{rank}.json")
    summary = bucketer.summary()
    if rank == 0:
        print(f"replicas identical: {identical}")
        print(
            f"communication {summary['comm_s'] * 1e3:.1f} ms in total, "
            f"{summary['exposed_s'] * 1e3:.1f} ms exposed in wait()"
        )
        # The same training in one process with the whole batch: data parallelism must
        # reproduce it up to float64 rounding.
        reference = init_params(args.sizes, args.seed)
        for step in range(args.steps):
            x, y = global_batch(step, world * args.batch, args.sizes, args.seed)
            for p, g in zip(reference, loss_and_grads(reference, x, y)[1]):
                p -= args.lr * g
        diff = max(float(np.abs(p - q).max()) for p, q in zip(params, reference))
        print(f"max |params - one-process batch {world * args.batch}| = {diff:.3e}")
    comm.close()
    if not identical:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
