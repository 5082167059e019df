"""Several threads on one communicator: calls that race raise ConcurrentUseError instead
of pairing with another thread's call on another rank and combining its data."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ringreduce as rr
from ringreduce.errors import ConcurrentUseError

from _ranks import run_ranks

CALLS = 200


def _two_threads_all_reduce(comm):
    """The issue's reproduction: two threads each run all_reduce(np.full(1000, k)) 200
    times on one communicator. Every call must return k * world_size or raise; returns
    (wrong results, ConcurrentUseError messages, other errors, right results)."""
    n = comm.world_size
    wrong, concurrent, other, right = [], [], [], [0]
    start = threading.Barrier(2)

    def worker(k: int) -> None:
        start.wait()
        for _ in range(CALLS):
            try:
                y = comm.all_reduce(np.full(1000, k, dtype=np.float64))
            except ConcurrentUseError as exc:
                concurrent.append(str(exc))
                return
            except Exception as exc:  # noqa: BLE001 (reported to the test)
                other.append(f"{type(exc).__name__}: {exc}")
                return
            if not np.all(y == k * n):
                wrong.append(float(y[0]))
            else:
                right[0] += 1

    threads = [threading.Thread(target=worker, args=(k,), name=f"adder-{k}") for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return wrong, concurrent, other, right[0]


def test_two_threads_on_one_communicator_raise_and_never_return_wrong_data():
    outcomes = run_ranks(2, _two_threads_all_reduce, timeout=180, init_timeout=5)
    assert [o[0] for o in outcomes] == ["ok", "ok"], [o[2] for o in outcomes]
    raised = 0
    for _status, (wrong, concurrent, other, _right), _tb in outcomes:
        assert wrong == [], f"wrong results returned: {wrong[:5]}"
        raised += len(concurrent)
        for text in concurrent:
            # Both threads are named, and what to do instead.
            assert "adder-1" in text and "adder-2" in text, text
            assert "one thread at a time" in text, text
        # A rank whose own threads never overlapped hears of it from its peer: it stops
        # getting answers (its peer refuses collectives) and times out instead.
        for text in other:
            assert "TimeoutError" in text or "PeerError" in text, text
    assert raised >= 1


def _refused_after_a_race(comm):
    """After a race, every collective on the communicator raises, from any thread."""
    issuer = comm._issuer
    # Stand in for another thread in the middle of issuing a call.
    issuer.enter(None)
    try:
        done = threading.Event()
        seen = []

        def racer() -> None:
            try:
                comm.barrier()
            except ConcurrentUseError as exc:
                seen.append(str(exc))
            done.set()

        t = threading.Thread(target=racer, name="racer")
        t.start()
        t.join(30)
    finally:
        issuer.leave()
    later = []
    for call in (
        lambda: comm.all_reduce(np.ones(3)),
        lambda: comm.all_reduce(np.ones(3), async_op=True),
        lambda: comm.all_gather(np.ones(3)),
        lambda: comm.broadcast(np.ones(3)),
    ):
        try:
            call()
            later.append("no error")
        except ConcurrentUseError as exc:
            later.append("refused" if "refuses every collective" in str(exc) else str(exc))
    return seen, later


def test_a_race_is_named_and_the_communicator_then_refuses_collectives():
    comm = rr.init("tcp", rank=0, world_size=1)
    try:
        seen, later = _refused_after_a_race(comm)
        assert len(seen) == 1 and "'racer'" in seen[0] and "MainThread" in seen[0], seen
        assert later == ["refused"] * 4
    finally:
        comm.close()


def _take_turns(comm):
    """Threads that take turns (one after another, same order on every rank) are fine:
    only calls that overlap are refused."""
    results = []

    def one(k: int) -> None:
        results.append(comm.all_reduce(np.full(4, k, dtype=np.int64)).tolist())

    for k in range(3):
        t = threading.Thread(target=one, args=(k,))
        t.start()
        t.join(60)
    results.append(comm.all_reduce(np.full(4, 7, dtype=np.int64), async_op=True).wait().tolist())
    return results


@pytest.mark.parametrize("n", [2, 3])
def test_threads_taking_turns_are_fine(group_factory, n):
    want = [[k * n] * 4 for k in (0, 1, 2, 7)]
    assert group_factory(n).run(_take_turns) == [want] * n


def test_queue_threads_makes_a_second_thread_wait_its_turn():
    # The torch backend's mode: torch leaves the order of its threads' calls to the
    # program, so a call waits for the one being issued instead of raising.
    from ringreduce import Communicator

    solo = rr.init("tcp", rank=0, world_size=1)
    comm = Communicator(solo._core, queue_threads=True)
    try:
        comm._issuer.enter(None)  # another thread's call, being issued
        result = []
        t = threading.Thread(target=lambda: result.append(comm.all_reduce(np.arange(3.0))))
        t.start()
        t.join(0.5)
        waited = t.is_alive() and not result
        comm._issuer.leave()
        t.join(30)
        assert waited, "the second call did not wait"
        assert len(result) == 1 and np.array_equal(result[0], np.arange(3.0))
        assert comm._issuer.conflict is None
    finally:
        solo.close()


def _turns_in_opposite_orders(comm, blocking: bool):
    """Two threads that never overlap but take turns in a different order on each rank:
    rank 0 runs 'adder-1' then 'adder-2', rank 1 the reverse. No check on one rank can
    see a race; the call header's thread tag does."""
    order = (1, 2) if comm.rank == 0 else (2, 1)
    results, errors = [], []

    def one(k: int) -> None:
        try:
            x = np.full(8, k, dtype=np.float64)
            y = comm.all_reduce(x) if blocking else comm.all_reduce(x, async_op=True).wait()
            results.append((k, float(y[0])))
        except Exception as exc:  # noqa: BLE001 (reported to the test)
            errors.append(exc)

    for k in order:
        t = threading.Thread(target=one, args=(k,), name=f"adder-{k}")
        t.start()
        t.join(60)
    return results, [(type(e).__name__, str(e), e.peer) for e in errors]


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_threads_taking_turns_in_different_orders_raise_instead_of_mixing_data(blocking):
    outcomes = run_ranks(2, _turns_in_opposite_orders, blocking, timeout=120, init_timeout=5)
    assert [o[0] for o in outcomes] == ["ok", "ok"], [o[2] for o in outcomes]
    for rank, (_status, (results, errors), _tb) in enumerate(outcomes):
        assert all(total == 2 * k for k, total in results), f"rank {rank}: wrong data {results}"
        # The first call pairs adder-1 with adder-2: both ranks see the tags differ.
        assert errors, f"rank {rank}: no error, results {results}"
        kind, text, peer = errors[0]
        assert kind == "ConcurrentUseError", text
        mine = "'adder-1'" if rank == 0 else "'adder-2'"  # the peer's may not have started
        assert f"from thread {mine}" in text and "different order" in text, text
        assert "one thread at a time" in text and peer == 1 - rank, text


def _same_role_threads(comm):
    """Threads with Python's default names take turns in the same order on every rank;
    rank 0 made an extra thread first, so their names' counters differ between ranks."""
    if comm.rank == 0:
        spare = threading.Thread(target=lambda: None)
        spare.start()
        spare.join()
    results = []

    def work(k: int) -> None:
        results.append(comm.all_reduce(np.full(4, k, dtype=np.int64)).tolist())

    names = []
    for k in range(3):
        t = threading.Thread(target=work, args=(k,))
        names.append(t.name)
        t.start()
        t.join(60)
    return results, names


def test_default_thread_names_that_differ_only_in_their_counter_pair_up(group_factory):
    (res0, names0), (res1, names1) = group_factory(2).run(_same_role_threads)
    assert names0 != names1  # e.g. 'Thread-5 (work)' here, 'Thread-4 (work)' there
    assert res0 == res1 == [[2 * k] * 4 for k in range(3)]
