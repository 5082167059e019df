"""Communicators made and closed in a row, as a training job's restarts and subgroups do.

Each rank is a process of its own that makes a communicator, runs one checked all_reduce
of a size that changes every cycle (so a rank that met another cycle's peer is caught by
the call check or the numbers), and closes it, again and again. Half of the cycles reuse
one store directory, which used to hand a rank the previous communicator's segment record
(SIGBUS); on TCP, rank 0 hosts a fresh store on the same port every cycle. Every rank
must end with a zero exit code, no signal, no error and no wrong result.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from _ranks import free_port

_RANK = textwrap.dedent(
    """
    import faulthandler, os, sys
    import numpy as np
    import ringreduce as rr

    faulthandler.enable()
    # A rank still here near the test's 240 s budget prints where every thread is.
    faulthandler.dump_traceback_later(200, exit=False)
    rank, n, cycles, where = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    transport, call = sys.argv[5], sys.argv[6] == "call"
    errors = wrong = 0
    for i in range(cycles):
        if where.isdigit():
            place = dict(master_addr="127.0.0.1", master_port=int(where))
        elif where.endswith("+fresh"):
            place = dict(store_dir=os.path.join(where[:-6], str(i)))
        else:
            place = dict(store_dir=where)
        try:
            with rr.init(transport, rank=rank, world_size=n, timeout=30, **place) as comm:
                if not call:
                    continue  # closed as soon as made
                x = np.full(1000 + i, rank + 1, np.float32)
                y = comm.all_reduce(x)
                if y.shape != x.shape or not (y == n * (n + 1) / 2).all():
                    wrong += 1
        except Exception as e:
            errors += 1
            print(f"rank {rank} cycle {i}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    print(f"{errors} {wrong}")
    """
)


def _churn(n: int, cycles: int, where: str, transport: str, call: bool = True):
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _RANK,
                str(r),
                str(n),
                str(cycles),
                where,
                transport,
                "call" if call else "none",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
        results.append((p.returncode, out, err))
    for rank, (code, out, err) in enumerate(results):
        died = f" (killed by {signal.Signals(-code).name})" if code < 0 else ""
        assert code == 0, f"rank {rank} exited with {code}{died}:\n{err[-8000:]}"
        errors, wrong = (int(v) for v in out.split())
        assert (errors, wrong) == (0, 0), (
            f"rank {rank}: {errors} errors, {wrong} wrong results in {cycles} cycles:\n"
            f"{err[-3000:]}"
        )


@pytest.mark.parametrize("n", [2, 3])
def test_shm_communicators_in_a_row_on_a_reused_and_on_fresh_store_directories(n, tmp_path):
    # 300 communicators: 150 meeting in one directory, 150 each in a new one.
    _churn(n, 150, str(tmp_path / "reused"), "shm")
    (tmp_path / "fresh").mkdir()
    _churn(n, 150, str(tmp_path / "fresh") + "+fresh", "shm")


def test_tcp_communicators_in_a_row_on_one_port():
    _churn(3, 50, str(free_port()), "tcp")


def test_auto_communicators_in_a_row_on_one_port():
    # shm links plus point-to-point links over TCP, and the TCP store.
    _churn(2, 50, str(free_port()), "auto")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_communicators_closed_as_soon_as_made(transport):
    # No collective in between: rank 0, which hosts the store, may close before the
    # others have finished reading it; their init must not fail for that.
    _churn(4, 20, str(free_port()), transport, call=False)
