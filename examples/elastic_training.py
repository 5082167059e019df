"""Data-parallel training that survives a dead rank: a numpy MLP on N ranks; when a rank
dies mid-step, the survivors shrink the communicator, average the step's gradients
among themselves (only the dead rank's micro-batch is lost) and go on, with no restart.
With ``--grow-step``, a newcomer then joins, receives the weights and the lost data
shard, and the run finishes on N ranks again.

    ringreduce launch -n 4 --keep-going -- \
        python examples/elastic_training.py --kill-rank 2 --kill-step 7 --grow-step 12

Every rank prints its loss per step and, at the end, a hash of its weights: the
replicas' weights are bitwise identical. ``--kill-rank`` kills that rank (SIGKILL, as
an out-of-memory kill or a lost node would) while the others are in step
``--kill-step``'s all_reduce; without it nothing fails. ``--grow-step``: at the start
of that step the lowest survivor starts a new process (``--join``, as a scheduler would
start a replacement), the survivors ``grow`` back to N and hand it their state.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys

import numpy as np

import ringreduce as rr

IN, HIDDEN, OUT, BATCH = 8, 32, 1, 64


def say(line: str) -> None:
    """Prints one line in one write: a newcomer shares its starter's stdout, and print()
    may write the text and its newline apart (unbuffered), letting another line in."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


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


def average(comm: rr.Communicator, g: np.ndarray, step: int, last, shard: int) -> tuple:
    """(the mean of g over the live ranks, the communicator that computed it, each live
    rank's shard when the ranks changed, else None). On a PeerError the survivors
    shrink and average again among themselves. A death may end a call on some ranks and
    not on others (those that had all they needed end it), so the survivors first say
    which step they are in: one a step behind takes that step's mean (``last``, as the
    ranks ahead computed it with the dead rank) from the lowest rank ahead, and the
    ranks ahead average their step again, with it."""
    alive = None
    while True:
        try:
            return comm.all_reduce(g, op="sum") / comm.world_size, comm, alive
        except rr.PeerError as exc:
            survivors = comm.shrink()
            if survivors.rank == 0:
                say(f"rank(s) {sorted(exc.failed)} died; {survivors.world_size} go on")
            comm.close()
            comm = survivors
            where = comm.all_gather(np.array([shard, step])).reshape(-1, 2)
            alive, steps = where[:, 0], where[:, 1]
            if steps.min() != steps.max():
                root = int(np.flatnonzero(steps == steps.max())[0])
                mean = np.array(last) if step == steps.max() else np.empty_like(g)
                comm.broadcast(mean, root=root)
                if step == steps.min():
                    return mean, comm, alive


def grow_back(comm: rr.Communicator, size: int, lost: list, w: list, step: int, argv: list):
    """The survivors start newcomers for the lost shards, grow back to ``size`` ranks and
    hand them the weights: (the grown communicator, the newcomers' processes)."""
    started = []
    if comm.rank == 0:
        for _ in lost:
            started.append(subprocess.Popen([sys.executable, __file__, "--join", *argv]))
    grown = comm.grow(size, timeout=60)
    grown.share_state(state_of(w, step, lost))
    if grown.rank == 0:
        say(f"step {step:3d}  shard(s) {lost} back on newcomers")
    comm.close()
    return grown, started


def state_of(w: list, step: int, lost: list) -> dict:
    return {"w0": w[0], "w1": w[1], "w2": w[2], "step": np.array([step]), "lost": np.array(lost)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=7)
    p.add_argument("--grow-step", type=int, default=-1)
    p.add_argument("--save", help="write each rank's weights into this folder (shard<N>.npz)")
    p.add_argument("--join", action="store_true", help="a newcomer: join the running job")
    args = p.parse_args()
    argv = [a for a in sys.argv[1:] if a != "--join"]
    started: list = []
    if args.join:
        comm = rr.join(timeout=60)
        state = comm.share_state(None)
        w = [state["w0"], state["w1"], state["w2"]]
        lost = [int(s) for s in state["lost"]]
        shard = lost[comm.rank - (comm.world_size - len(lost))]
        first = int(state["step"][0])
    else:
        comm = rr.init(timeout=20)
        shard = comm.rank  # the data this process trains on, for the whole run
        w, first = init_weights(), 0
    size, lost, last = comm.world_size, [], None
    for step in range(first, args.steps):
        if step == args.grow_step and lost and not args.join:
            comm, started = grow_back(comm, size, lost, w, step, argv)
            lost = []
        loss, grads = loss_and_grads(w, *micro_batch(shard, step))
        if shard == args.kill_rank and step == args.kill_step and not args.join:
            os.kill(os.getpid(), signal.SIGKILL)  # the others are in this step's all_reduce
        # One all_reduce a step: the gradients and the loss.
        last, comm, alive = average(comm, np.append(flat(grads), loss), step, last, shard)
        if alive is not None:  # which shards died with their ranks
            lost = sorted(set(range(size)) - set(int(s) for s in alive))
        w = [wi - args.lr * gi for wi, gi in zip(w, unflat(last[:-1], grads))]
        if comm.rank == 0:
            say(f"step {step:3d}  ranks {comm.world_size}  loss {last[-1]:.6f}")
    digest = hashlib.sha256(b"".join(wi.tobytes() for wi in w)).hexdigest()[:16]
    say(f"shard {shard}: weights {digest}")
    if args.save:
        np.savez(os.path.join(args.save, f"shard{shard}.npz"), *w)
    comm.close()
    for proc in started:
        if proc.wait(timeout=120) != 0:
            sys.exit(f"a newcomer exited with {proc.returncode}")


if __name__ == "__main__":
    main()
