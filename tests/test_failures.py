"""Failure paths: every surviving rank raises the right error, and nothing hangs."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

import ringreduce as rr

from _data import links_and_sizes
from _ranks import RankGroup, run_ranks


def _all_reduce_count(comm, counts):
    comm.all_reduce(np.ones(counts[comm.rank], dtype=np.float32))


def _timed(comm, fn, *args):
    """Runs fn(comm, *args) and returns (its error, seconds until the error)."""
    start = time.monotonic()
    try:
        fn(comm, *args)
    except rr.RingReduceError as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def _all_reduce_dtype(comm, dtypes):
    comm.all_reduce(np.ones(10, dtype=dtypes[comm.rank]))


def _all_reduce_op(comm, ops):
    comm.all_reduce(np.ones(10, dtype=np.float32), op=ops[comm.rank])


def _different_collectives(comm):
    if comm.rank == 0:
        comm.broadcast(np.ones(10, dtype=np.float32), root=0)
    else:
        comm.all_reduce(np.ones(10, dtype=np.float32))


def _error_then_retry(comm, counts):
    """Fails with a mismatch, then checks that the communicator refuses more work."""
    try:
        comm.all_reduce(np.ones(counts[comm.rank], dtype=np.float32))
    except rr.RingReduceError as first:
        try:
            comm.all_reduce(np.ones(4, dtype=np.float32))
        except rr.RingReduceError as second:
            # The process is healthy: numpy and a fresh world-of-one still work.
            solo = rr.init("tcp", rank=0, world_size=1, master_port=1)
            ok = bool(np.all(solo.all_reduce(np.ones(3)) == 1))
            solo.close()
            return type(first).__name__, str(second), ok
        return type(first).__name__, "second call ran", False
    return "no error", "", False


def _absent_rank(comm, late_rank, directory, count=1000):
    """The late rank never calls the collective (an all_reduce of ``count`` floats): it
    waits until every other rank has its error (each leaves a file saying so), then
    returns."""
    done = os.path.join(directory, "done{}")
    if comm.rank == late_rank:
        deadline = time.monotonic() + 120
        while not all(
            os.path.exists(done.format(r)) for r in range(comm.world_size) if r != late_rank
        ):
            if time.monotonic() > deadline:
                return "the others never finished"
            time.sleep(0.01)
        return "absent"
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(count, dtype=np.float32))
        outcome = "no error"
    except rr.RingReduceError as exc:
        outcome = type(exc).__name__, exc.peer, str(exc), time.monotonic() - start
    with open(done.format(comm.rank), "w"):
        pass
    return outcome


def _all_reduce_loop_until_error(comm, seconds):
    start = time.monotonic()
    x = np.ones(1 << 18, dtype=np.float32)
    try:
        while time.monotonic() - start < seconds:
            comm.all_reduce(x, out=x)
            x[:] = 1
    except rr.RingReduceError as exc:
        return type(exc).__name__, exc.peer, str(exc), time.monotonic() - start
    return "no error"


def _kill_self_later(comm, victim, delay):
    if comm.rank == victim:
        time.sleep(delay)
        os.kill(os.getpid(), 9)
    return _all_reduce_loop_until_error(comm, 30)


def _close_early(comm, quitter):
    if comm.rank == quitter:
        comm.close()
        return "closed"
    return _all_reduce_loop_until_error(comm, 30)


@pytest.mark.parametrize("links,n", links_and_sizes([2, 3, 4], contract=(3,)))
@pytest.mark.parametrize(
    "fn, args",
    [
        (_all_reduce_count, "counts"),
        (_all_reduce_dtype, "dtypes"),
        (_all_reduce_op, "ops"),
        (_different_collectives, None),
    ],
    ids=["count", "dtype", "op", "collective"],
)
def test_mismatch_raises_on_every_rank(n, fn, args, links):
    last = n - 1
    arg = {
        "counts": [10] * last + [12],
        "dtypes": [np.float32] * last + [np.float64],
        "ops": ["sum"] * last + ["max"],
        None: None,
    }[args]
    outcomes = run_ranks(
        n, _timed, fn, *([arg] if arg is not None else []), init_timeout=60, transport=links
    )
    assert all(o[0] == "ok" for o in outcomes), [o[2] for o in outcomes]
    # The rank that saw the mismatch raises MismatchError; the others learn of
    # it through the store and raise MismatchError too, naming the culprits,
    # long before the 60 s timeout would have ended their waits.
    for _, (error, seconds), _ in outcomes:
        assert isinstance(error, rr.MismatchError), error
        assert "mismatch between rank" in str(error)
        assert seconds < 30, f"the error took {seconds:.1f} s: it came from the timeout"


def test_mismatch_message_names_both_calls():
    outcomes = run_ranks(2, _all_reduce_count, [10, 12], init_timeout=20)
    msg = (
        str(outcomes[1][1]) if isinstance(outcomes[1][1], rr.MismatchError) else str(outcomes[0][1])
    )
    assert "all_reduce(count=10, float32, sum)" in msg
    assert "all_reduce(count=12, float32, sum)" in msg


def _error_text(comm, counts):
    try:
        comm.all_reduce(np.ones(counts[comm.rank], dtype=np.float64))
    except rr.RingReduceError as exc:
        return type(exc).__name__, str(exc)
    return None


@pytest.mark.parametrize("links", ["shm", "tcp"])
def test_each_rank_tells_its_own_call_first(links):
    """Rank 1's error starts with rank 1's call, then names rank 0's, whichever rank
    found the mismatch and published it first (rank 0 passes 3 values, rank 1 four)."""
    outcomes = run_ranks(2, _error_text, [3, 4], init_timeout=20, transport=links)
    texts = [value for status, value, tb in outcomes if status == "ok" or pytest.fail(tb)]
    for rank, (kind, text) in enumerate(texts):
        assert kind == "MismatchError", text
        count = 3 + rank
        assert text.startswith(f"rank {rank}: all_reduce(count={count}, float64, sum) (call #1)"), (
            text
        )
        assert "all_reduce(count=3, float64, sum)" in text, text
        assert "all_reduce(count=4, float64, sum)" in text, text


def test_a_rank_that_only_heard_of_the_failure_tells_its_own_call_first():
    """Ranks 0 and 1 agree, rank 2 does not: every rank's text starts with its own call,
    the ranks that learnt of the mismatch through the first report included."""
    counts = [5, 5, 6]
    outcomes = run_ranks(3, _error_text, counts, init_timeout=20)
    texts = [value for status, value, tb in outcomes if status == "ok" or pytest.fail(tb)]
    for rank, (kind, text) in enumerate(texts):
        assert kind == "MismatchError", text
        own = f"rank {rank}: all_reduce(count={counts[rank]}, float64, sum) (call #1) failed: "
        assert text.startswith(own + "collective mismatch between rank "), text
        assert "all_reduce(count=6, float64, sum)" in text, text


def _mismatch_facts(comm, counts):
    """The attributes of the MismatchError this rank raises (exceptions cross the process
    boundary without their attributes)."""
    try:
        comm.all_reduce(np.ones(counts[comm.rank], dtype=np.float32))
    except rr.MismatchError as exc:
        return exc.reason, exc.ranks, exc.calls, exc.issuers, exc.peer
    return None


def test_mismatch_carries_both_sides_as_attributes():
    # Rank 2 calls with another count: rank 2 finds it in rank 1's header, rank 0 in
    # rank 2's. Whichever is published first, every rank raises it with its facts.
    counts = [10, 10, 12]
    outcomes = run_ranks(3, _mismatch_facts, counts, init_timeout=20)
    facts = [value for status, value, tb in outcomes if status == "ok" or pytest.fail(tb)]
    assert all(f is not None for f in facts), facts
    assert all(f[:4] == facts[0][:4] for f in facts), facts  # the same news everywhere
    reason, ranks, calls, issuers, peer = facts[0]
    assert reason == "call"
    assert ranks in ((1, 2), (2, 0)), ranks
    for rank, call in zip(ranks, calls):
        assert call.startswith(f"all_reduce(count={counts[rank]}, float32, sum)"), calls
    assert all(isinstance(t, int) for t in issuers), issuers
    assert peer == ranks[0]


def test_communicator_refuses_calls_after_an_error():
    outcomes = run_ranks(3, _error_then_retry, [10, 10, 11], init_timeout=20)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        first, second, healthy = value
        assert first == "MismatchError"
        assert "failed earlier" in second
        assert healthy


def _absent_named(n, late, directory, count, links, timeout=3.0):
    """Runs _absent_rank; every other rank must raise TimeoutError naming the late one.
    Returns each of them's seconds from its call to its error."""
    outcomes = run_ranks(
        n, _absent_rank, late, directory, count, init_timeout=timeout, timeout=120, transport=links
    )
    seconds = {}
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        if rank == late:
            assert value == "absent"
            continue
        kind, peer, message, seconds[rank] = value
        assert (kind, peer) == ("TimeoutError", late), message
        call = f"all_reduce(count={count}, float32, sum)"
        assert f"rank {late} did not start {call}" in message, message
        # Each rank tells its own call first, whoever's wait it learnt the culprit from.
        assert message.startswith(f"rank {rank}: {call} (call #"), message
    return seconds


@pytest.mark.parametrize("links,n", links_and_sizes([2, 3, 4], contract=(3,)))
def test_rank_that_never_arrives_times_out_naming_it(n, tmp_path, links):
    # Every rank names the absent one, even the ranks that waited on a waiting
    # neighbour: the ranks follow the chain of waits to its end. The timeout is also
    # init's: 3 s leaves room for 4 ranks starting on 2 busy cores.
    _absent_named(n, n - 1, str(tmp_path), 1000, links)


@pytest.mark.parametrize("links", ["shm", "tcp"])
def test_once_every_other_rank_timed_out_the_absent_one_is_named_without_more_waiting(
    tmp_path, links
):
    """The ranks that time out compare whom each waited for (a rank may have waited on a
    waiting one), for up to a second. Once every rank but one has said, the one left is
    the end of every chain: the last rank to time out then names it at once, and the
    others with it, not a second after the timeout."""
    timeout = 4.0
    seconds = _absent_named(4, 3, str(tmp_path), 1000, links, timeout=timeout)
    assert min(seconds.values()) < timeout + 0.5, seconds


def test_a_rank_that_never_publishes_a_tiny_call_is_named(tmp_path):
    """A tiny all_reduce over shared memory waits on the bulletin, not on a message:
    the absent rank is named the same way."""
    _absent_named(3, 2, str(tmp_path), 2, "shm")


_OVER = r"over (shared memory|tcp|MPI)"
_WAITING = re.compile(r"while rank \d+ was (receiving|sending|waiting for) .+ " + _OVER)
_TWICE = re.compile(_OVER + r" while rank")


@pytest.mark.parametrize("links,n", links_and_sizes([2, 3, 4], contract=(3,)))
def test_killed_rank_gives_peer_error_on_every_survivor(n, links):
    victim = 1
    with RankGroup(n, timeout=60, transport=links) as group:
        outcomes = group.outcomes(_kill_self_later, victim, 0.5, timeout=120)
    for rank, (status, value, tb) in enumerate(outcomes):
        if rank == victim:
            assert status == "dead"
            continue
        assert status == "ok", tb
        kind, peer, message, elapsed = value
        assert kind == "PeerError", message
        assert peer == victim, message
        # Detected from the socket, or the process ending, not at the 60 s timeout.
        assert elapsed < 30
        # Worded by the waiter, once: what was learned of the victim, then what the rank
        # that learned it was waiting for, and over what.
        assert _WAITING.search(message), message
        assert not _TWICE.search(message), message


def test_peer_that_closes_gives_error_naming_it(links):
    outcomes = run_ranks(3, _close_early, 2, init_timeout=30, transport=links)
    assert outcomes[2][1] == "closed"
    for status, value, tb in outcomes[:2]:
        assert status == "ok", tb
        kind, peer, message, elapsed = value
        assert kind == "PeerError", message
        assert peer == 2, message
        # Learned from the close, not from the 30 s deadline: a rank whose sends to
        # the closed rank had all left, waiting on another rank, hears of it too.
        assert "no progress for" not in message and elapsed < 15, (elapsed, message)


def test_timeout_error_is_a_builtin_timeout_error():
    assert issubclass(rr.TimeoutError, TimeoutError)
    assert issubclass(rr.TimeoutError, rr.RingReduceError)
    assert issubclass(rr.PeerError, rr.RingReduceError)
    assert issubclass(rr.MismatchError, rr.RingReduceError)


def test_rendezvous_timeout_when_nobody_hosts_the_store():
    from _ranks import free_port

    start = time.monotonic()
    with pytest.raises(rr.TimeoutError, match="rendezvous store"):
        rr.init(
            "tcp",
            rank=1,
            world_size=2,
            master_addr="127.0.0.1",
            master_port=free_port(),
            timeout=1.0,
        )
    assert time.monotonic() - start < 30  # the 1 s timeout ended the wait, not the default


def _store_host_fails_and_exits(comm, counts):
    """Rank 0 hosts the store; it sees the mismatch, and its process ends at once."""
    try:
        comm.all_reduce(np.ones(counts[comm.rank], dtype=np.float32))
    except rr.RingReduceError as exc:
        if comm.rank == 0:
            os._exit(0)  # like a training script dying on the exception
        return type(exc).__name__, str(exc)
    return "no error", ""


@pytest.mark.parametrize("n", [3, 4])
def test_failure_report_survives_the_store_host_exiting(n, links):
    # Rank 0 receives from the last rank, so it is the one that sees the mismatch.
    counts = [10] * (n - 1) + [11]
    outcomes = run_ranks(n, _store_host_fails_and_exits, counts, init_timeout=20, transport=links)
    assert outcomes[0][0] == "dead"
    for status, value, tb in outcomes[1:]:
        assert status == "ok", tb
        kind, message = value
        assert kind == "MismatchError", message
        assert "mismatch between rank" in message


def _thresholds_differ(comm, port):
    # A second communicator whose ranks disagree on RINGREDUCE_SMALL_BYTES, so
    # rank 1 would take the ring where the others take the small-message path.
    os.environ["RINGREDUCE_SMALL_BYTES"] = "0" if comm.rank == 1 else str(1 << 20)
    other = rr.init("tcp", rank=comm.rank, world_size=comm.world_size, master_port=port, timeout=20)
    try:
        other.all_reduce(np.ones(100, dtype=np.float32))
    except rr.RingReduceError as exc:
        return type(exc).__name__, str(exc)
    finally:
        other.close()
    return "no error", ""


def test_ranks_choosing_different_algorithms_get_mismatch_error():
    from _ranks import free_port

    outcomes = run_ranks(3, _thresholds_differ, free_port(), init_timeout=20)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        kind, message = value
        assert kind == "MismatchError", message
        assert "small-message path" in message


@pytest.mark.parametrize("n", [3, 4])
def test_killed_store_host_is_named_by_every_survivor(n, links):
    # Rank 0 also hosts the rendezvous store, where failures are published: with
    # it gone, ranks that only saw a neighbour close its link must still name rank 0.
    with RankGroup(n, timeout=60, transport=links) as group:
        outcomes = group.outcomes(_kill_self_later, 0, 0.5, timeout=120)
    assert outcomes[0][0] == "dead"
    for status, value, tb in outcomes[1:]:
        assert status == "ok", tb
        kind, peer, message, elapsed = value
        assert kind == "PeerError", message
        assert peer == 0, message
        assert elapsed < 30


def _refuse_broadcast_then(comm, then):
    """Rank 1 passes a read-only array to broadcast (a ValueError there, before any
    communication) while the others are in the broadcast; then it closes, or calls
    something else."""
    if comm.rank == 1:
        readonly = np.ones(10, dtype=np.float32)
        readonly.flags.writeable = False
        try:
            comm.broadcast(readonly, root=0)
            return "no error"
        except ValueError as exc:
            local = str(exc)
        if then == "close":
            comm.close()
            return ("refused", None, local)
        try:
            comm.all_reduce(np.ones(10, dtype=np.float32))
            return "no error"
        except rr.RingReduceError as exc:
            return (type(exc).__name__, exc.peer, str(exc))
    try:
        comm.broadcast(np.ones(10, dtype=np.float32), root=0)
        # The root only sends: its part may be done before anything goes wrong.
        # Its next collective then fails.
        assert comm.rank == 0, "a broadcast into rank 1's missing array completed"
        comm.barrier()
        return "no error"
    except rr.RingReduceError as exc:
        return (type(exc).__name__, exc.peer, str(exc))


@pytest.mark.parametrize("then", ["close", "other call"])
def test_argument_error_on_one_rank_is_named_by_every_rank(then, links):
    outcomes = run_ranks(3, _refuse_broadcast_then, then, init_timeout=30, transport=links)
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        kind, peer, message = value
        if rank == 1 and then == "close":
            assert kind == "refused" and "read-only" in message, message
            continue
        # Every other rank (and rank 1 itself, when its next call met the broadcast)
        # names rank 1 and the reason it gave, not only a closed link or a mismatch.
        assert peer == 1, (rank, message)
        assert "rank 1 refused its call #1, broadcast: ValueError:" in message, (rank, message)
        assert "read-only" in message, (rank, message)
        # Told by rank 1's leaving, not by a deadline (rank 0, in the barrier after
        # its part of the broadcast, waits on rank 2, not on rank 1).
        assert "within 30 s" not in message, (rank, message)


def _abort_while_the_peer_is_away(comm, mode):
    """Rank 0 has collectives running and queued that rank 1 does not join yet; another
    thread of rank 0 calls abort(). Rank 1 comes later and must learn of it at once."""
    import threading

    x = np.ones(1000, dtype=np.float32)
    if comm.rank == 1:
        time.sleep(2.0)  # away while rank 0 aborts
        start = time.monotonic()
        try:
            comm.all_reduce(x)
            return "no error"
        except rr.RingReduceError as exc:
            return type(exc).__name__, exc.peer, time.monotonic() - start
    aborted_at = []

    def abort_later():
        time.sleep(0.5)
        aborted_at.append(time.monotonic())
        comm.abort()

    threading.Thread(target=abort_later, daemon=True).start()
    failed = []  # (error, when) of each call
    if mode == "sync":
        try:
            comm.all_reduce(x)  # blocking, run on this thread
        except rr.RingReduceError as exc:
            failed.append((exc, time.monotonic()))
    else:
        works = [comm.all_reduce(x, async_op=True) for _ in range(3)]  # one runs, two queued
        for work in works:
            try:
                work.wait()
            except rr.RingReduceError as exc:
                failed.append((exc, time.monotonic()))
    latency = max(when for _, when in failed) - aborted_at[0] if failed else None
    try:
        comm.all_reduce(x)
        refused = "not refused"
    except rr.RingReduceError as exc:
        refused = str(exc)
    comm.close()  # still closable
    return [str(e) for e, _ in failed], latency, refused


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_abort_fails_running_and_queued_calls_at_once_and_the_peer_names_the_rank(mode, links):
    outcomes = run_ranks(2, _abort_while_the_peer_is_away, mode, init_timeout=60, transport=links)
    assert all(o[0] == "ok" for o in outcomes), [o[2] for o in outcomes]
    errors, latency, refused = outcomes[0][1]
    assert len(errors) == (1 if mode == "sync" else 3), errors
    assert all("abort() was called" in e for e in errors), errors
    # 100 ms is the aim; 1 s leaves room for 2 busy cores.
    assert latency is not None and latency < 1.0, f"failed {latency:.3f} s after abort()"
    assert "abort() was called" in refused, refused
    kind, peer, seconds = outcomes[1][1]
    # Rank 1 learns from the links rank 0 tore down, not from its own 60 s timeout.
    assert (kind, peer) == ("PeerError", 0), outcomes[1][1]
    assert seconds < 5, f"rank 1 named rank 0 after {seconds:.1f} s"
