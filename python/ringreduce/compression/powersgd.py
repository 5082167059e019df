"""PowerSGD: low-rank gradient compression over any communicator (Vogels et al., 2019).

Terms used below:
- *matrix*: a gradient of two or more dimensions, seen as ``n x m`` (first dimension by
  the rest). It is compressed when ``(n + m) * r * min_compression_rate < n * m``, with
  ``r = min(n, m, rank)``; everything else (vectors, scalars, small matrices, and every
  tensor during its first ``start_iter`` calls) is an *exact* tensor.
- *P* and *Q*: the two factors, ``n x r`` and ``m x r``. One call makes one P all-reduce
  and one Q all-reduce for all of its matrices; matrices of one shape are stacked into a
  batch so that their products are one batched matmul each.
- *residual*: what the approximation dropped of this rank's input, added to its next
  gradient (error feedback); *warm start*: the previous step's Q starts the next step's
  power iteration.

One step for the matrices M_i of the ranks i (sums are all-reduces):

    P = sum_i M_i Q;  P = orth(P);  Q = sum_i M_i^T P / N;  average ~= P Q^T

Every rank all-reduces the same P, orthogonalizes it with the same float32 code and
multiplies the same P and Q, so every rank ends with the same bits. Residuals and warm
start Q are kept per *name*, which the caller gives per tensor (a parameter's name), so
they survive any re-bucketing and are saved by `PowerSGD.state_dict`.

This module needs only numpy and a communicator (anything with ``world_size`` and
``all_reduce(x, "sum", out=x, async_op=True)`` returning a work with ``wait()``).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["PowerSGD", "PowerSGDWork", "orthogonalize"]

# (name, (m, r)) of every matrix that needs a fresh Q -> one float32 m x r array each.
QInit = Callable[[List[Tuple[str, Tuple[int, int]]]], List[np.ndarray]]


def orthogonalize(p: np.ndarray, epsilon: float = 0.0) -> np.ndarray:
    """Orthonormalizes the columns of each matrix of a ``(batch, n, r)`` float32 stack, in
    place, by modified Gram-Schmidt run twice; returns it. Deterministic: the same input
    gives the same bits. The second pass ("twice is enough") keeps the columns orthogonal
    when P has lower rank than r: a column that lay in the span of the earlier ones is
    then rounding noise, which one pass normalizes into a vector far from orthogonal to
    them, and which would add that much of the gradient twice. A zero column stays zero
    (rather than becoming NaN) when epsilon is 0."""
    for _ in range(2):
        for j in range(p.shape[2]):
            col = p[:, :, j : j + 1]
            norm = np.sqrt(np.einsum("bnk,bnk->bk", col, col))[:, None, :]
            if epsilon:
                norm += np.float32(epsilon)
            else:
                norm[norm == 0] = 1
            col /= norm
            if j + 1 < p.shape[2]:
                rest = p[:, :, j + 1 :]
                rest -= np.einsum("bnk,bnl->bl", col, rest)[:, None, :] * col
    return p


def _seeded_q(seed: int) -> QInit:
    """Fresh Q from a generator seeded by (seed, the name's CRC-32): the same on every
    rank, whatever order the names come in."""

    def init(requests: List[Tuple[str, Tuple[int, int]]]) -> List[np.ndarray]:
        out = []
        for name, shape in requests:
            gen = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out.append(gen.standard_normal(shape).astype(np.float32))
        return out

    return init


class _Batch:
    """Matrices of one (n, m, r) shape: their stacked inputs and their P and Q views."""

    def __init__(self, names: List[str], indices: List[int], m_stack: np.ndarray, r: int):
        self.names = names
        self.indices = indices  # positions in the caller's list
        self.m = m_stack  # (b, n, m) float32: input plus residual
        self.r = r
        self.p: np.ndarray = np.empty(0, np.float32)
        self.q: np.ndarray = np.empty(0, np.float32)


class PowerSGD:
    """Rank-``rank`` PowerSGD all-reduce of lists of float gradients over ``comm``.

    ``reduce(grads, names)`` replaces every array of ``grads`` by its average over the
    ranks: matrices by their rank-r approximation, the rest exactly (in one flat
    all-reduce). ``start`` does the same asynchronously (see `PowerSGDWork`).

    Args:
        comm: the communicator (duck-typed: ``world_size`` and ``all_reduce``).
        rank: the approximation rank r (the paper's 1-4; some NLP models need 32).
        warm_start: start each step's power iteration from the previous step's Q.
        error_feedback: add what the approximation dropped to the next gradient, per name.
        min_compression_rate: compress a matrix only if it shrinks at least this much.
        start_iter: the first ``start_iter`` calls that carry a name reduce it exactly.
        seed: seeds the fresh Q (the same on every rank).
        epsilon: added to every column norm in the orthogonalization (0: none).
        q_init: replaces the seeded fresh Q (e.g. to reproduce another implementation).
    """

    def __init__(
        self,
        comm: Any,
        rank: int = 1,
        *,
        warm_start: bool = True,
        error_feedback: bool = True,
        min_compression_rate: float = 2.0,
        start_iter: int = 0,
        seed: int = 0,
        epsilon: float = 0.0,
        q_init: Optional[QInit] = None,
    ):
        if rank < 1:
            raise ValueError(f"PowerSGD: rank must be at least 1, not {rank}")
        self.comm = comm
        self.rank = int(rank)
        self.warm_start = warm_start
        self.error_feedback = error_feedback
        self.min_compression_rate = float(min_compression_rate)
        self.start_iter = int(start_iter)
        self.epsilon = float(epsilon)
        self._q_init = q_init if q_init is not None else _seeded_q(seed)
        self._residuals: Dict[str, np.ndarray] = {}
        self._qs: Dict[str, np.ndarray] = {}
        self._seen: Dict[str, int] = {}
        self._pending: List[PowerSGDWork] = []
        self._counts = {"elements": 0, "sent": 0, "compressed": 0, "exact": 0}

    # -- what gets compressed --------------------------------------------------------
    def compresses(self, name: str, shape: Sequence[int]) -> bool:
        """Whether the next call compresses a tensor of this name and shape."""
        if len(shape) < 2 or self._seen.get(name, 0) < self.start_iter:
            return False
        n, m = int(shape[0]), int(np.prod(shape[1:]))
        r = min(n, m, self.rank)
        return (n + m) * r * self.min_compression_rate < n * m

    # -- reducing -------------------------------------------------------------------
    def reduce(
        self, grads: Sequence[np.ndarray], names: Optional[Sequence[str]] = None
    ) -> List[np.ndarray]:
        """Averages ``grads`` over the ranks in place and returns them."""
        return self.start(grads, names).wait()

    def start(
        self, grads: Sequence[np.ndarray], names: Optional[Sequence[str]] = None
    ) -> PowerSGDWork:
        """Launches the first all-reduces (the exact tensors, then P) and returns their
        work. Before returning it moves every earlier call's work that is still waiting
        for its P on to its Q all-reduce, so that call's Q goes on the wire behind this
        call's P and its orthogonalization ran while this call's P was in flight."""
        names = [str(i) for i in range(len(grads))] if names is None else list(names)
        if len(names) != len(grads) or len(set(names)) != len(names):
            raise ValueError("PowerSGD: one distinct name per gradient is needed")
        work = PowerSGDWork(self, list(grads), names)
        earlier, self._pending = self._pending, []
        for w in earlier:
            w.advance()
        if work._stage == 1:
            self._pending.append(work)
        return work

    def _fresh_q(self, requests: List[Tuple[str, Tuple[int, int]]]) -> None:
        if requests:
            for (name, shape), q in zip(requests, self._q_init(requests)):
                q = np.asarray(q, dtype=np.float32).reshape(shape)
                self._qs[name] = np.ascontiguousarray(q)

    # -- statistics and state ---------------------------------------------------------
    def stats(self) -> dict:
        """Counts since construction: ``elements`` given, ``sent`` (elements all-reduced:
        exact ones plus P and Q), ``compressed`` and ``exact`` tensors, and ``rate``
        (elements / sent)."""
        out = dict(self._counts)
        out["rate"] = out["elements"] / out["sent"] if out["sent"] else 0.0
        return out

    def state_dict(self) -> dict:
        """This rank's residuals, the warm-start Q (the same on every rank) and the
        per-name call counts, as numpy arrays and ints (copies)."""
        return {
            "version": 1,
            "rank": self.rank,
            "residuals": {k: v.copy() for k, v in self._residuals.items()},
            "q": {k: v.copy() for k, v in self._qs.items()},
            "seen": dict(self._seen),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` saved (this rank's own, for the residuals)."""
        if state.get("version") != 1:
            raise ValueError(f"PowerSGD: unknown state version {state.get('version')!r}")
        if state["rank"] != self.rank:
            raise ValueError(
                f"PowerSGD: the state is of rank {state['rank']}, this one has rank {self.rank}"
            )
        self._residuals = {k: np.array(v, dtype=np.float32) for k, v in state["residuals"].items()}
        self._qs = {k: np.array(v, dtype=np.float32) for k, v in state["q"].items()}
        self._seen = {k: int(v) for k, v in state["seen"].items()}


class PowerSGDWork:
    """One `PowerSGD.start` call in flight. Stages: 1, P all-reduce issued; 2, Q
    all-reduce issued; 3, done. `advance` issues the Q all-reduce; `wait` finishes.

    Collectives are issued only by ``start``, ``advance`` and ``wait``: call them in the
    same order on every rank (from one thread, or ordered), since a communicator matches
    collectives by their order. ``wait`` may be called from another thread once
    ``advance`` has run, as it then issues nothing.
    """

    def __init__(self, owner: PowerSGD, grads: List[np.ndarray], names: List[str]):
        self._o = owner
        self._grads = grads
        self._n = owner.comm.world_size
        self._exact_idx: List[int] = []
        self._batches: List[_Batch] = []
        self._result: Optional[List[np.ndarray]] = None
        self._launch(names)

    def _launch(self, names: List[str]) -> None:
        o = self._o
        shapes: Dict[Tuple[int, int, int], List[int]] = {}
        for i, (g, name) in enumerate(zip(self._grads, names)):
            if o.compresses(name, g.shape):
                n, m = g.shape[0], g.size // g.shape[0]
                shapes.setdefault((n, m, min(n, m, o.rank)), []).append(i)
            else:
                self._exact_idx.append(i)
            o._seen[name] = o._seen.get(name, 0) + 1
            o._counts["elements"] += g.size
        exact_size = sum(self._grads[i].size for i in self._exact_idx)
        self._exact = np.empty(exact_size, np.float32)
        at = 0
        for i in self._exact_idx:
            g = self._grads[i]
            self._exact[at : at + g.size] = g.reshape(-1)
            at += g.size
        # The exact tensors go first: they are ready now, and P needs a matmul.
        self._exact_work = (
            o.comm.all_reduce(self._exact, "sum", out=self._exact, async_op=True)
            if exact_size
            else None
        )

        fresh = []
        for (n, m, r), idx in shapes.items():
            batch_names = [names[i] for i in idx]
            stack = np.empty((len(idx), n, m), np.float32)
            for k, i in enumerate(idx):
                residual = o._residuals.get(batch_names[k]) if o.error_feedback else None
                if residual is None:
                    stack[k] = self._grads[i].reshape(n, m)
                else:  # one pass: input plus residual, into the stack
                    np.add(self._grads[i].reshape(n, m), residual, out=stack[k])
            self._batches.append(_Batch(batch_names, idx, stack, r))
            for name in batch_names:
                q = o._qs.get(name) if o.warm_start else None
                if q is None or q.shape != (m, r):
                    fresh.append((name, (m, r)))
        o._fresh_q(fresh)
        p_size = sum(len(b.names) * b.m.shape[1] * b.r for b in self._batches)
        self._p = np.empty(p_size, np.float32)
        at = 0
        for b in self._batches:
            q = np.stack([o._qs[name] for name in b.names])
            orthogonalize(q, o.epsilon)
            b.p = self._p[at : at + q.shape[0] * b.m.shape[1] * b.r].reshape(
                q.shape[0], b.m.shape[1], b.r
            )
            np.matmul(b.m, q, out=b.p)
            at += b.p.size
        self._p_work = (
            o.comm.all_reduce(self._p, "sum", out=self._p, async_op=True) if p_size else None
        )
        q_size = sum(len(b.names) * b.m.shape[2] * b.r for b in self._batches)
        o._counts["sent"] += exact_size + p_size + q_size
        o._counts["compressed"] += sum(len(b.names) for b in self._batches)
        o._counts["exact"] += len(self._exact_idx)
        self._stage = 1 if self._batches else 2

    def advance(self) -> None:
        """Waits for P, orthogonalizes it, computes Q and issues its all-reduce (once)."""
        if self._stage != 1:
            return
        self._p_work.wait()
        q_size = sum(len(b.names) * b.m.shape[2] * b.r for b in self._batches)
        self._q = np.empty(q_size, np.float32)
        at = 0
        for b in self._batches:
            orthogonalize(b.p, self._o.epsilon)
            count, m = len(b.names), b.m.shape[2]
            b.q = self._q[at : at + count * m * b.r].reshape(count, m, b.r)
            np.matmul(b.m.transpose(0, 2, 1), b.p, out=b.q)
            at += b.q.size
        self._q_work = self._o.comm.all_reduce(self._q, "sum", out=self._q, async_op=True)
        self._stage = 2
        if self in self._o._pending:
            self._o._pending.remove(self)

    def issued(self) -> bool:
        """True once every collective of the call is issued (``wait`` issues none)."""
        return self._stage >= 2

    def done(self) -> bool:
        """True once ``wait`` has finished the call."""
        return self._stage == 3

    def wait(self) -> List[np.ndarray]:
        """Finishes the call: every gradient now holds the average (in place); returns
        them."""
        if self._stage == 3:
            return self._result  # type: ignore[return-value]
        self.advance()
        o, n = self._o, self._n
        if self._exact_work is not None:
            self._exact_work.wait()
            self._exact /= np.float32(n)
            at = 0
            for i in self._exact_idx:
                g = self._grads[i]
                g[...] = self._exact[at : at + g.size].reshape(g.shape)
                at += g.size
        if self._batches:
            self._q_work.wait()
            self._q /= np.float32(n)
            for b in self._batches:
                approx = np.matmul(b.p, b.q.transpose(0, 2, 1))
                if o.error_feedback:
                    # The residuals are views of this call's stack, made in place: one
                    # pass, no new memory (the next call reads them into a new stack).
                    np.subtract(b.m, approx, out=b.m)
                for k, (name, i) in enumerate(zip(b.names, b.indices)):
                    if o.error_feedback:
                        o._residuals[name] = b.m[k]
                    if o.warm_start:
                        o._qs[name] = b.q[k].copy()
                    g = self._grads[i]
                    g[...] = approx[k].reshape(g.shape)
                if not o.warm_start:
                    for name in b.names:
                        o._qs.pop(name, None)
        self._stage = 3
        self._result = self._grads
        return self._grads
