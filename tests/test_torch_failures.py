"""The torch backend when things go wrong: mismatched calls name both ranks, the group's
timeout is honoured, ``abort()`` cancels a collective a peer never joins (torchft's
use), ``Work.wait(timeout)`` gives up after its own timeout, and a program that ends
with a future in flight still exits cleanly."""

from __future__ import annotations

import datetime
import time

import pytest

torch = pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)
import torch.distributed as dist  # noqa: E402
from _torch_ranks import run  # noqa: E402


def _mismatched_sizes(rank, n):
    try:
        dist.all_reduce(torch.ones(10 + rank))
    except Exception as exc:  # noqa: BLE001 - the message is the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _silent_peer(rank, n):
    if rank == 1:
        start = time.monotonic()
        try:
            dist.recv(torch.empty(3), 0)
        except Exception as exc:  # noqa: BLE001
            return f"{time.monotonic() - start:.1f} {exc}"
        return "no error"
    time.sleep(6)
    return None


def test_mismatched_sizes_name_the_ranks():
    msgs = run(2, _mismatched_sizes)
    for msg in msgs:
        assert "MismatchError" in msg and "rank 0" in msg and "rank 1" in msg, msg


def test_timeout_of_init_process_group_is_honoured():
    got = run(2, _silent_peer, timeout_s=2.0)[1]
    seconds, msg = got.split(" ", 1)
    assert 1.5 <= float(seconds) <= 10, got
    assert "rank 0" in msg, got


def _abort_from_another_thread(rank, n):
    """torchft's use: a collective the peer never joins is cancelled by pg.abort() from
    another thread, promptly, without killing the process."""
    import threading

    from ringreduce.torch import ProcessGroupRingReduce

    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, ProcessGroupRingReduce), type(pg)
    t = torch.ones(1000)
    if rank == 1:
        time.sleep(2.0)  # away while rank 0 aborts
        return "away"
    aborted_at = []

    def later():
        time.sleep(0.5)
        aborted_at.append(time.monotonic())
        pg.abort()

    threading.Thread(target=later, daemon=True).start()
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
        return "no error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{time.monotonic() - aborted_at[0]:.3f} {type(exc).__name__}: {exc}"


def test_abort_cancels_a_collective_the_peer_never_joins():
    got = run(2, _abort_from_another_thread, timeout_s=60.0)[0]
    seconds, msg = got.split(" ", 1)
    assert "abort() was called" in msg, got
    # 100 ms is the aim (gloo's abort waits for the peer: 8 s in the check).
    assert float(seconds) < 1.0, got


def _wait_with_a_timeout(rank, n):
    """A receive whose message comes 1.5 s late: wait(timeout=0.3 s) gives up on time and
    the receive keeps running; a second wait() gets the message."""
    if rank == 0:
        time.sleep(1.5)
        dist.send(torch.arange(3.0), 1)
        return None
    t = torch.zeros(3)
    work = dist.irecv(t, 0)
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=0.3))
        gave_up = "no error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        gave_up = f"{time.monotonic() - start:.3f} {type(exc).__name__}: {exc}"
    work.wait()
    return gave_up, t.tolist()


def test_work_wait_gives_up_after_its_own_timeout_and_the_work_goes_on():
    gave_up, received = run(2, _wait_with_a_timeout)[1]
    seconds, msg = gave_up.split(" ", 1)
    assert msg.startswith("TimeoutError") and "Timed out" in msg, gave_up
    assert 0.3 <= float(seconds) < 1.4, gave_up
    assert received == [0.0, 1.0, 2.0]


_EXIT_IN_FLIGHT = """
import torch, torch.distributed as dist
import ringreduce.torch as rrt
rrt.init_process_group()
t = torch.ones({n})
work = dist.all_reduce(t, async_op=True)
work.get_future()  # the group's watcher thread now waits in the engine for it
print("leaving", flush=True)
"""


def test_a_program_that_ends_with_a_future_in_flight_exits_cleanly(tmp_path):
    # The future's watcher is a daemon thread; if it came back from the engine while the
    # interpreter finalised, it was ended by force inside C++ frames and the process
    # aborted after its work was done ("terminate called without an active exception";
    # every run of this program did, until exit began to stop and wait for it).
    import subprocess
    import sys

    script = tmp_path / "exit_in_flight.py"
    script.write_text(_EXIT_IN_FLIGHT.format(n=16 << 20))
    for _ in range(2):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "ringreduce",
                "launch",
                "-n",
                "2",
                "--",
                sys.executable,
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "terminate called" not in out, out[-3000:]
        assert out.count("leaving") == 2, out[-3000:]
