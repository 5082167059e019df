"""Data-parallel training in JAX with ringreduce: ``all_reduce_tree`` on ``jax.grad``'s output.

    ringreduce launch -n 2 -- python examples/jax_dp.py
    mpirun -n 2 python examples/jax_dp.py
    python examples/jax_dp.py                      # alone: a world of one
    ringreduce launch -n 2 -- python examples/jax_dp.py --grads bfloat16

An MLP, whose parameters are a pytree of registered dataclasses (the style of flax and
equinox), learns to classify points of two interleaved spirals with SGD and momentum.
Every rank holds a replica, starts from the same weights (one PRNG key for all) and
computes the gradient of its own slice of each global batch;
``GradientBucketer.all_reduce_tree`` averages that gradient pytree over the ranks in
buckets and hands back the same structure of JAX arrays, so every replica applies the
same update. ``--grads bfloat16`` sends the gradients as bfloat16 leaves, half the
bytes. At the end every rank all-gathers its parameters: the replicas must be
identical, and rank 0 prints the test accuracy.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import ringreduce as rr


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Dense:
    w: jax.Array
    b: jax.Array


def init(key: jax.Array, sizes: list) -> list:
    """One Dense per layer, scaled for tanh."""
    layers = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in)
        layers.append(Dense(w, jnp.zeros(n_out)))
    return layers


def forward(params: list, x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer.w + layer.b)
    return x @ params[-1].w + params[-1].b


def loss_fn(params: list, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = forward(params, x)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


def spirals(n: int, seed: int) -> tuple:
    """n points on two interleaved spirals, with noise; label = which spiral."""
    g = np.random.default_rng(seed)
    t = g.random(n) * 3 * np.pi + 0.5
    label = g.integers(0, 2, n)
    sign = 1 - 2 * label
    xy = np.stack([t * np.cos(t) * sign, t * np.sin(t) * sign], axis=1) / 10
    return (xy + 0.03 * g.standard_normal((n, 2))).astype(np.float32), label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64, help="points per rank per step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--grads", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    comm = rr.init()
    rank, world = comm.rank, comm.world_size
    params = init(jax.random.PRNGKey(0), [2, 64, 64, 2])  # the same on every rank
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    bucketer = rr.GradientBucketer(comm, average=True)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    xs, ys = spirals(4096, 1)
    g = np.random.default_rng(0)  # the same global batches on every rank

    for step in range(args.steps):
        picked = g.choice(len(xs), world * args.batch, replace=False)
        mine = picked[rank * args.batch : (rank + 1) * args.batch]
        loss, grads = grad_fn(params, xs[mine], ys[mine])
        grads = jax.tree_util.tree_map(lambda t: t.astype(args.grads), grads)
        grads = bucketer.all_reduce_tree(grads)  # the average over ranks, same structure
        # SGD with momentum, leaf by leaf over the pytree.
        velocity = jax.tree_util.tree_map(lambda v, d: 0.9 * v + d.astype(v.dtype), velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - args.lr * v, params, velocity)
        if rank == 0 and step % 100 == 0:
            print(f"step {step:4d}  loss on rank 0's slice {float(loss):.4f}")

    test_x, test_y = spirals(1024, 2)
    accuracy = float(jnp.mean(jnp.argmax(forward(params, test_x), 1) == test_y))
    flat = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(params)])
    every = comm.all_gather(flat)
    same = all(np.array_equal(every[0], row) for row in every)
    if rank == 0:
        print(
            f"{world} ranks ({comm.transport}), {args.grads} gradients: test accuracy "
            f"{accuracy:.3f}, replicas identical: {same}"
        )
    comm.close()
    if not same:
        raise SystemExit("replicas differ")


if __name__ == "__main__":
    main()
