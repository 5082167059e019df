"""Sharded data parallelism (ZeRO stage 2) in plain numpy: reduce_scatter the gradient
buckets, update the local shard, all_gather the parameters.

    ringreduce launch -n 4 -- python examples/numpy_zero.py
    python examples/numpy_zero.py            # alone: a world of one

Every rank holds the full parameters (for its forward and backward) but only a 1/N shard
of the Adam state and updates only that shard. Each layer's gradients form a bucket, which
is reduce-scattered (averaged) as soon as backward finishes the layer, while the earlier
layers are still being differentiated: rank r receives block r of every bucket, the part
of the parameters it owns. After its Adam step on those blocks, one all_gather per bucket
gives every rank every updated block. This moves the same bytes as an all_reduce (a
reduce-scatter plus an all-gather, 2(N-1)/N of the parameters) but keeps N times less
optimizer state per rank.

The script then trains the same model with plain data parallelism (all_reduce of the
gradients, every rank updating everything) from the same start, and checks that the two
agree to 1e-12 in float64.
"""

from __future__ import annotations

import argparse

import numpy as np
from numpy_mlp import global_batch, init_params, loss_and_grads

import ringreduce as rr


class Adam:
    """Adam over a list of float64 arrays (a shard, or the whole model)."""

    def __init__(self, shapes: list, lr: float, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0
        self.m = [np.zeros(s) for s in shapes]
        self.v = [np.zeros(s) for s in shapes]

    def step(self, params: list, grads: list) -> None:
        b1, b2 = self.betas
        self.t += 1
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            m_hat = m / (1 - b1**self.t)
            v_hat = v / (1 - b2**self.t)
            p -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def state_elements(self) -> int:
        return sum(m.size + v.size for m, v in zip(self.m, self.v))


def train_zero(comm, args, params: list) -> tuple[list, int]:
    """ZeRO-2: returns the trained parameters and this rank's optimizer-state size."""
    rank, world = comm.rank, comm.world_size
    n_layers = len(params) // 2
    # Bucket l = layer l's weight and bias, flattened; rank r owns block r of each.
    sizes = [params[2 * i].size + params[2 * i + 1].size for i in range(n_layers)]
    blocks = [rr.chunk_bounds(size, world, rank) for size in sizes]
    adam = Adam([(stop - start,) for start, stop in blocks], args.lr)
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    for step in range(args.steps):
        x, y = global_batch(step, world * args.batch, args.sizes, args.seed)
        pending: dict = {}
        works: list = [None] * n_layers

        def on_grad(i: int, g: np.ndarray, pending=pending, works=works) -> None:
            pending[i] = g
            layer = i // 2
            if 2 * layer in pending and 2 * layer + 1 in pending:
                bucket = np.concatenate([pending[2 * layer].ravel(), pending[2 * layer + 1]])
                works[layer] = comm.reduce_scatter(bucket, op="avg", async_op=True)

        loss_and_grads(params, x[mine], y[mine], on_grad=on_grad)
        shard_grads = [w.wait() for w in works]
        # The shard of the parameters this rank owns, updated in place.
        shard = [
            np.concatenate([params[2 * i].ravel(), params[2 * i + 1]])[start:stop].copy()
            for i, (start, stop) in enumerate(blocks)
        ]
        adam.step(shard, shard_grads)
        # Every rank's updated blocks, in rank order, make each layer whole again.
        for i in range(n_layers):
            flat = comm.all_gather(shard[i], uneven=True)
            w, b = params[2 * i], params[2 * i + 1]
            w[...] = flat[: w.size].reshape(w.shape)
            b[...] = flat[w.size :]
    return params, adam.state_elements()


def train_plain(comm, args, params: list) -> tuple[list, int]:
    """Plain data parallelism: all-reduce the gradients, every rank updates everything."""
    rank, world = comm.rank, comm.world_size
    adam = Adam([p.shape for p in params], args.lr)
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    for step in range(args.steps):
        x, y = global_batch(step, world * args.batch, args.sizes, args.seed)
        _, grads = loss_and_grads(params, x[mine], y[mine])
        adam.step(params, [comm.all_reduce(g, op="avg") for g in grads])
    return params, adam.state_elements()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="rows per rank per step")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256, 256, 8])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    comm = rr.init()
    zero, zero_state = train_zero(comm, args, init_params(args.sizes, args.seed))
    plain, plain_state = train_plain(comm, args, init_params(args.sizes, args.seed))
    diff = max(float(np.abs(p - q).max()) for p, q in zip(zero, plain))
    worst = comm.all_reduce(np.array([diff]), op="max")[0]
    flat = np.concatenate([p.ravel() for p in zero])
    gathered = comm.all_gather(flat)
    identical = all(np.array_equal(gathered[0], g) for g in gathered)
    if comm.rank == 0:
        x, y = global_batch(args.steps, comm.world_size * args.batch, args.sizes, args.seed)
        print(
            f"{comm.world_size} ranks, {flat.size} parameters: Adam state per rank "
            f"{zero_state} values sharded vs {plain_state} replicated; "
            f"loss after {args.steps} steps {loss_and_grads(zero, x, y)[0]:.6f}"
        )
        print(f"replicas identical: {identical}")
        print(f"max |ZeRO - plain data parallel| = {worst:.3e}")
    comm.close()
    if not identical or worst > 1e-12:
        raise SystemExit("ZeRO and plain data parallelism disagree")


if __name__ == "__main__":
    main()
