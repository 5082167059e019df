"""Data-parallel training that survives a dead rank: a numpy MLP on N ranks; when a rank
dies mid-step, the survivors shrink the communicator, average the step's gradients
among themselves (only the dead rank's micro-batch is lost) and go on, with no restart.

    ringreduce launch -n 4 --keep-going -- \
        python examples/elastic_training.py --kill-rank 2 --kill-step 7

Every survivor prints its loss per step and, at the end, a hash of its weights: the
survivors' weights are bitwise identical. ``--kill-rank`` kills that rank (SIGKILL, as
an out-of-memory kill or a lost node would) while the others are in step
``--kill-step``'s all_reduce; without it nothing fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal

import numpy as np

import ringreduce as rr

IN, HIDDEN, OUT, BATCH = 8, 32, 1, 64


def init_weights(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.3, (IN, HIDDEN)), np.zeros(HIDDEN), rng.normal(0, 0.3, (HIDDEN, OUT))]


def micro_batch(shard: int, step: int) -> tuple:
    """Shard `shard`'s micro-batch of step `step` (the same on every run)."""
    rng = np.random.default_rng([shard, step])
    x = rng.normal(size=(BATCH, IN))
    y = np.sin(x.sum(axis=1, keepdims=True))
    return x, y


def loss_and_grads(w: list, x: np.ndarray, y: np.ndarray) -> tuple:
    h = np.tanh(x @ w[0] + w[1])
    err = h @ w[2] - y
    loss = float(np.mean(err**2))
    d_out = 2 * err / len(x)
    d_h = (d_out @ w[2].T) * (1 - h**2)
    return loss, [x.T @ d_h, d_h.sum(axis=0), h.T @ d_out]


def flat(grads: list) -> np.ndarray:
    return np.concatenate([g.ravel() for g in grads])


def unflat(v: np.ndarray, like: list) -> list:
    out, at = [], 0
    for g in like:
        out.append(v[at : at + g.size].reshape(g.shape))
        at += g.size
    return out


def average(comm: rr.Communicator, g: np.ndarray) -> tuple:
    """The mean of g over the live ranks, and the communicator that computed it: on a
    PeerError the survivors shrink and average again among themselves."""
    while True:
        try:
            return comm.all_reduce(g, op="sum") / comm.world_size, comm
        except rr.PeerError as exc:
            survivors = comm.shrink()
            if survivors.rank == 0:
                print(f"rank(s) {sorted(exc.failed)} died; {survivors.world_size} go on",
                      flush=True)  # fmt: skip
            comm.close()
            comm = survivors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=7)
    p.add_argument("--save", help="write each rank's weights into this folder (shard<N>.npz)")
    args = p.parse_args()
    comm = rr.init(timeout=20)
    shard = comm.rank  # the data this process trains on, for the whole run
    w = init_weights()
    for step in range(args.steps):
        loss, grads = loss_and_grads(w, *micro_batch(shard, step))
        if shard == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)  # the others are in this step's all_reduce
        mean, comm = average(comm, flat(grads))
        w = [wi - args.lr * gi for wi, gi in zip(w, unflat(mean, grads))]
        mean_loss, comm = average(comm, np.array([loss]))
        if comm.rank == 0:
            print(f"step {step:3d}  ranks {comm.world_size}  loss {mean_loss[0]:.6f}", flush=True)
    digest = hashlib.sha256(b"".join(wi.tobytes() for wi in w)).hexdigest()[:16]
    print(f"shard {shard}: weights {digest}", flush=True)
    if args.save:
        np.savez(os.path.join(args.save, f"shard{shard}.npz"), *w)
    comm.close()


if __name__ == "__main__":
    main()
