"""``ringreduce model --probe``: times a few collectives on local ranks, per transport, for
:func:`ringreduce.model.fit`.

The driver (:func:`probe`) launches the ranks with ``ringreduce.launch``, once per
transport; each rank runs :func:`main` (``python -m ringreduce.model.probe``), and rank 0
writes the times, the maximum over ranks, as JSON.

Load on the machine only adds time, so each rank keeps its fastest round. A job whose
largest message of a collective was not slower than its smallest was disturbed past
what that keeps (every call paying for being descheduled, whatever its size): its
samples say nothing about bandwidth, so the job runs again, and after ``attempts``
such jobs the probe says the machine is too busy instead of fitting an infinite
bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from .fitting import Sample, fit

__all__ = ["DEFAULT_SIZES", "main", "probe"]

# all_gather separates latency from bandwidth on the wire alone; all_reduce adds the
# reduction (and, at small sizes, the latency path). Small enough for a few seconds.
DEFAULT_SIZES: dict[str, tuple[int, ...]] = {
    "all_gather": (4 << 10, 64 << 10, 1 << 20, 4 << 20),
    "all_reduce": (4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20),
}
_TARGET_S = 0.03  # timed seconds per round and size, about


def probe(
    nprocs: int,
    transports: Sequence[str] = ("shm", "tcp"),
    sizes: dict[str, Sequence[int]] | None = None,
    rounds: int = 3,
    attempts: int = 3,
) -> list[Sample]:
    """Runs the probe on ``nprocs`` local ranks once per transport; returns the samples.

    Raises RuntimeError when a probe job fails, or when ``attempts`` jobs in a row over
    one transport timed some collective's largest size no slower than its smallest.
    """
    if nprocs < 2:
        raise ValueError("the probe needs at least 2 ranks (-n 2)")
    plan = {k: tuple(int(s) for s in v) for k, v in (sizes or DEFAULT_SIZES).items()}
    samples: list[Sample] = []
    for transport in transports:
        for attempt in range(1, attempts + 1):
            got = _run_job(nprocs, transport, plan, rounds)
            flat = _flat(got)
            if flat is None:
                break
            if attempt == attempts:
                raise RuntimeError(
                    f"probe over {transport}: {flat} in {attempts} jobs in a row; the machine "
                    "is too busy to measure bandwidth (try again when it is idle)"
                )
        samples.extend(got)
    return samples


def _run_job(nprocs: int, transport: str, plan: dict, rounds: int) -> list[Sample]:
    """One probe job on ``nprocs`` ranks over ``transport``: its samples, in plan order."""
    from ..launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        cmd = [sys.executable, "-m", "ringreduce.model.probe", "--out", out]
        cmd += ["--plan", json.dumps(plan), "--rounds", str(rounds)]
        rc = launch(nprocs, cmd, transport=transport)
        if rc != 0 or not os.path.exists(out):
            raise RuntimeError(f"probe on {nprocs} ranks over {transport} failed (exit {rc})")
        with open(out) as f:
            data = json.load(f)
    return [
        Sample(s["collective"], s["nbytes"], data["ranks"], data["transport"], s["seconds"])
        for s in data["samples"]
    ]


def _flat(samples: Sequence[Sample]) -> str | None:
    """What makes a job's samples useless for a fit, or None: a collective whose largest
    size took no longer than its smallest (the time did not grow with the bytes), or a
    fit that put every size's time in the latency term (beta = 0)."""
    by_collective: dict[str, list[Sample]] = {}
    for s in samples:
        by_collective.setdefault(s.collective, []).append(s)
    for collective, group in by_collective.items():
        small = min(group, key=lambda s: s.nbytes)
        large = max(group, key=lambda s: s.nbytes)
        if large.nbytes > small.nbytes and large.seconds <= small.seconds:
            return (
                f"{collective} of {large.nbytes:.0f} bytes took {large.seconds * 1e6:.0f} us, "
                f"no longer than {small.nbytes:.0f} bytes ({small.seconds * 1e6:.0f} us)"
            )
    links, _ = fit(samples)
    for kind, link in links.items():
        if link.beta <= 0:
            times = ", ".join(
                f"{s.collective} {s.nbytes:.0f} B {s.seconds * 1e6:.0f} us" for s in samples
            )
            return f"the fit found no bandwidth term for {kind} (beta = 0; {times})"
    return None


def _timed(comm: Any, fn: Callable[[], Any], iters: int) -> float:
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _call(comm: Any, collective: str, x: np.ndarray) -> Callable[[], Any]:
    """A call of ``collective`` on x into a buffer of its own, to time again and again."""
    if collective == "all_reduce":
        out = np.empty_like(x)
        return lambda: comm.all_reduce(x, out=out)
    if collective == "all_gather":
        gathered = np.empty((comm.world_size, x.size), dtype=x.dtype)
        return lambda: comm.all_gather(x, out=gathered)
    raise SystemExit(f"probe: cannot time {collective}")


def main(argv: Sequence[str] | None = None) -> int:
    """One rank of the probe (started by :func:`probe`)."""
    p = argparse.ArgumentParser(prog="python -m ringreduce.model.probe")
    p.add_argument("--out", required=True)
    p.add_argument("--plan", default=json.dumps(DEFAULT_SIZES))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from .._comm.bootstrap import init

    plan = json.loads(args.plan)
    comm = init()
    try:
        if "+" in comm.transport:
            raise SystemExit(f"probe: one link kind at a time, not {comm.transport}")
        samples = []
        for _ in range(3):  # the first calls of a job pay for connecting and paging
            comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
            comm.all_gather(np.ones(1 << 10, dtype=np.float32))
        for collective, sizes in plan.items():
            for nbytes in sizes:
                x = np.ones(max(1, int(nbytes) // 4), dtype=np.float32)
                fn = _call(comm, collective, x)
                fn()
                fn()  # warm: links connected, pages touched
                once = comm.all_reduce(np.array([_timed(comm, fn, 1)]), "max")[0]
                iters = int(min(200, max(3, _TARGET_S / max(once, 1e-7))))
                # Load only adds time: the fastest round is the least disturbed one.
                best = min(_timed(comm, fn, iters) for _ in range(args.rounds))
                worst = comm.all_reduce(np.array([best]), "max")[0]
                samples.append(
                    {"collective": collective, "nbytes": x.nbytes, "seconds": float(worst)}
                )
        if comm.rank == 0:
            data = {"ranks": comm.world_size, "transport": comm.transport, "samples": samples}
            with open(args.out, "w") as f:
                json.dump(data, f)
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
