"""Surviving a dead rank: the communicator is revoked on every survivor, calls after that
raise PeerError naming the dead, ``agree`` gives every survivor the same answer, and
``shrink`` makes a working communicator of the survivors, also when rank 0 (the store's
host) is the one that died, and again after a second death."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import ringreduce as rr
from ringreduce._comm.membership import agreement as membership

from _data import extended
from _ranks import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "_shrink_rank.py")
_HOSTS = {"tcp": ("tcp", 0), "shm": ("shm", 0), "shm+tcp": ("auto", 2)}


def run_job(n: int, links: str, scenario: str, timeout: float = 90, stopped=()) -> dict:
    """Runs the ranks; returns {rank: report} of those that finished (the dead print
    nothing). The ``stopped`` ranks stop themselves: they are waited for last, and
    killed once the others are done."""
    transport, hosts = _HOSTS[links]
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, str(r), str(n), port, transport, str(hosts), scenario],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    reports, errors = {}, []
    try:
        order = [r for r in range(n) if r not in stopped] + list(stopped)
        for r in order:
            p = procs[r]
            if r in stopped:
                p.kill()
            out, err = p.communicate(timeout=timeout)
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if lines:
                reports[r] = lines[-1]
            elif p.returncode != -9:
                errors.append(f"--- rank {r} (exit {p.returncode}):\n{err[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not errors, "\n".join(errors)
    return reports


CASES = [
    ("tcp", 4, [2]),
    ("shm", 4, [2]),
    ("tcp", 4, [0]),  # the rendezvous store's host
    ("shm", 3, [0]),
    ("shm+tcp", 4, [1]),
    extended("tcp", 5, [3, 0]),
    extended("shm", 6, [5]),
]


def ring_links_kept(before: list, after: list, rank: int) -> list:
    """[TCP ring links taken over, made anew] for ``rank`` when the ring of ``before``
    (ranks in order) shrinks to ``after``: its link to its right neighbour and from its
    left one are kept where that neighbour was its neighbour on the same side before."""
    if len(after) == 1:
        return [0, 0]
    i, j = after.index(rank), before.index(rank)
    kept = (after[(i + 1) % len(after)] == before[(j + 1) % len(before)]) + (
        after[i - 1] == before[j - 1]
    )
    return [kept, 2 - kept]


def local_peers_after(links: str, n: int, alive: list, victim: int, rank: int) -> int:
    """The surviving ranks on ``rank``'s host but itself: the shared memory kept
    (``_shrink_rank.py`` places rank r on emulated host r * hosts // n)."""
    transport, hosts = _HOSTS[links]
    if transport == "tcp":
        return 0
    host = (lambda r: r * hosts // n) if hosts else (lambda r: 0)
    return sum(1 for a in alive if a not in (victim, rank) and host(a) == host(rank))


@pytest.mark.parametrize("links, n, victims", CASES)
def test_survivors_shrink_and_go_on(links, n, victims):
    reports = run_job(n, links, "die=" + ",".join(map(str, victims)))
    survivors = [r for r in range(n) if r not in victims]
    assert sorted(reports) == survivors, reports
    for rank, report in reports.items():
        alive = list(range(n))
        for victim, seen in zip(victims, report["rounds"]):
            dead_index = alive.index(victim)  # the victim's rank in the communicator that lost it
            assert seen["peer"] == dead_index and seen["failed"] == [dead_index], (rank, seen)
            assert seen["revoked"] and seen["again"] == [dead_index], (rank, seen)
            assert seen["failed_ranks"] == [dead_index], (rank, seen)
            # Only the TCP links that touched the dead rank are made anew (shm has none),
            # and the shared memory between survivors is kept.
            kept = ring_links_kept(alive, [a for a in alive if a != victim], rank)
            assert seen["links"] == (kept if links != "shm" else [0, 0]), (rank, seen)
            assert seen["shm_kept"] == local_peers_after(links, n, alive, victim, rank), seen
            # Nothing of the old communicator's but its send/recv memory (half of what it
            # mapped) stays mapped: the shrink took the rest over or let it go. The new
            # one maps its local ranks' segments twice (collectives, send/recv).
            local = local_peers_after(links, n, alive, victim, rank) + 1
            before, after = seen["segments"]
            assert after == before // 2 + (2 * local if local > 1 else 0), seen
            alive.remove(victim)
            # Renumbered in the old order; the all_reduce on the new one is right.
            assert seen["size"] == len(alive) and seen["old_of_new"] == rank, (rank, seen)
            assert seen["new_rank"] == alive.index(rank) and seen["ok"], (rank, seen)


@pytest.mark.parametrize(
    "links, n, victim",
    [("tcp", 4, 2), ("tcp", 3, 0), ("shm", 4, 2), ("shm+tcp", 4, 1), extended("shm+tcp", 8, 2)],
)
def test_links_taken_over_drop_what_the_failure_left_in_flight(links, n, victim):
    """The victim dies during 16 MiB all_reduces, with megabytes queued on every link and
    messages in the shared-memory inboxes: the links and memory kept by the shrink must
    come back clean, so calls of every size (one message to many segments) on the shrunk
    communicator match numpy."""
    reports = run_job(n, links, f"bigdie={victim}")
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors, reports
    for rank, report in reports.items():
        (seen,) = report["rounds"]
        assert seen["peer"] == victim and seen["size"] == n - 1, (rank, seen)
        tcp_kept = ring_links_kept(list(range(n)), survivors, rank) if links != "shm" else [0, 0]
        assert seen["links"] == tcp_kept, (rank, seen)
        assert seen["shm_kept"] == local_peers_after(links, n, list(range(n)), victim, rank)
        assert seen["ok"], (rank, seen)


def test_a_rank_learns_at_once_that_its_right_neighbour_died():
    """Over TCP a rank hears of a dead right neighbour while it waits on another rank
    (the end of the stream it sends on, without a goodbye), not when it next sends there:
    here rank 0 waits on rank 2, 6 s late, when rank 1 dies 0.5 s into the call."""
    reports = run_job(3, "tcp", "rightdies")
    (seen,) = reports[0]["rounds"]
    assert seen["peer"] == 1 and seen["kind"] == "PeerError", seen
    assert seen["after_s"] < 3, seen


def test_agree_is_an_and_over_every_rank_and_a_healthy_shrink_keeps_everyone():
    reports = run_job(3, "tcp", "agree")
    assert sorted(reports) == [0, 1, 2]
    for rank, report in reports.items():
        assert report["votes"] == [False, True], report
        assert report["many"] == [k % 3 != 0 for k in range(40)], report
        # Rank 0 hosted all 42 rounds: its store dropped every check-in once decided,
        # and keeps the last _DECISIONS_KEPT (16) decisions, of 2 after the first two
        # (without forgetting: 4 keys a round, 160 more).
        before, after = report["keys"]
        if rank == 0:
            assert after - before == membership._DECISIONS_KEPT - 2, report
        else:
            assert after == before, report  # nothing hosted there
        (shrunk,) = report["rounds"]
        assert shrunk == {"new_rank": rank, "size": 3, "ok": True}, report


@pytest.mark.parametrize("links", ["tcp", "shm"])
def test_a_rank_that_dies_during_the_shrink_is_left_out_too(links):
    # The agreement counted it alive; making the new communicator then fails on the
    # survivors, naming it, and they agree and make it again without it.
    n, first, second = 4, 1, 3
    reports = run_job(n, links, f"shrinkdie={first},{second}")
    assert sorted(reports) == [0, 2], reports
    for rank, report in reports.items():
        (seen,) = report["rounds"]
        assert seen["failed_ranks"] == [first, second], (rank, seen)
        assert seen["size"] == 2 and seen["new_rank"] == [0, 2].index(rank) and seen["ok"], seen


@pytest.mark.parametrize("links, n, victim", [("shm", 4, 2), ("tcp", 4, 1), ("shm", 3, 0)])
def test_a_stopped_rank_is_left_out_without_waiting_for_it(links, n, victim):
    # SIGSTOP: the rank's sockets stay open (its standby store accepts connections and
    # never answers) and its pid lives. Its own machine's /proc says it is stopped, so
    # the survivors of the revoked communicator count it dead at once, where waiting
    # for it takes 2 s (giving up on a stopped agreement host) and 2.5 s (a suspected
    # rank's grace to check in). Victim 0 also hosts the rendezvous store, which the
    # survivors' failure reports then find unanswering.
    reports = run_job(n, links, f"stop={victim}", stopped=[victim])
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors, reports
    for rank, report in reports.items():
        (seen,) = report["rounds"]
        assert seen["error"] in ("TimeoutError", "PeerError") and seen["revoked"], seen
        assert seen["failed_ranks"] == [victim], (rank, seen)
        assert seen["size"] == n - 1 and seen["new_rank"] == survivors.index(rank), seen
        assert seen["ok"], seen
        assert seen["shrink_s"] < 2.0, (rank, seen)


def test_the_meeting_store_passes_on_that_its_host_is_unreachable():
    """A shrunk communicator's store (MeetingStore over a client of the host's standby
    store, made with the job's keepalive) tells the engine when the host's machine
    answers nothing, so that a failure report says so; never for a host in this process.
    (tests/test_multihost.py cuts such a host off for real.)"""
    from ringreduce._comm.membership.meeting import MeetingStore

    class Client:
        def __init__(self, unreachable: bool):
            self.unreachable = unreachable

        def host_unreachable(self) -> bool:
            return self.unreachable

    assert MeetingStore(Client(True), hosted_here=False).host_unreachable()
    assert not MeetingStore(Client(False), hosted_here=False).host_unreachable()
    assert not MeetingStore(Client(True), hosted_here=True).host_unreachable()


class _AbsentRankStore:
    """A store in this process's memory that rank 1 never comes to: it records when the
    engine asks whether rank 1 is gone, and says yes the ``gone_at``-th time."""

    def __init__(self, look_ms, gone_at: int = 8):
        self._data: dict = {}
        self.asked: list = []
        self._gone_at = gone_at
        if look_ms is not None:
            self.peer_look_ms = lambda: look_ms

    def set(self, key, value):
        self._data[key] = bytes(value)

    def try_get(self, key):
        return self._data.get(key)

    def set_if_absent(self, key, value):
        return self._data.setdefault(key, bytes(value))

    def peer_gone(self, rank):
        self.asked.append((time.monotonic(), rank))
        return len(self.asked) >= self._gone_at


@pytest.mark.parametrize("look_ms", [5, None], ids=["store-says-5ms", "default"])
def test_a_store_sets_how_often_the_engine_looks_for_a_gone_rank(look_ms):
    """The engine asks a store's peer_gone about a rank it waits for every
    peer_look_ms() (a shrink's meeting store: 10 ms for a few ranks, so a member dying
    while the communicator is made costs milliseconds), and every 50 ms for a store
    that does not say; the wait then fails with PeerError naming the rank."""
    from ringreduce import _core

    store = _AbsentRankStore(look_ms)
    options = _core.Options()
    options.transport = "tcp"
    options.timeout_seconds = 30.0
    with pytest.raises(rr.PeerError) as info:
        _core.Communicator.create_with_store(store, 0, 2, "127.0.0.1", "a test meeting", options)
    assert info.value.peer == 1 and "rank 1" in str(info.value), str(info.value)
    assert {rank for _, rank in store.asked} == {1}
    assert len(store.asked) == 8
    times = [t for t, _ in store.asked]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    median = gaps[len(gaps) // 2]
    if look_ms is None:
        assert median >= 0.045, gaps  # sleeps do not end early
    else:
        assert median < 0.025, gaps  # 5 ms asked; 50 ms would be the default


def test_candidate_hosts_that_answer_no_connection_are_waited_out_together():
    # How a cut-off rank learns it is a minority in one connect time whatever its rank:
    # it waits for every lower candidate host at once (membership._silent). A listening
    # socket whose accept queue is full drops connections unanswered, as a machine
    # behind a partition does; one that listens answers; a closed port refuses.
    from ringreduce._comm.membership.meeting import probe, silent_throughout

    def address(listen: bool, backlog: int = 16) -> tuple:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
        if listen:
            sock.listen(backlog)
        return sock.getsockname()

    held: list = []
    try:
        full = [address(True, 0) for _ in range(3)]
        for where in full:  # fill each queue: later connects get no answer
            for _ in range(4):
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(where)
                held.append(c)
        answers, refuses = address(True), address(False)
        assert [probe(a) for a in (full[0], answers, refuses)] == ["silent", "answered", "refused"]
        start = time.monotonic()
        silent = silent_throughout(
            {0: refuses, 1: answers, 2: full[0], 3: full[1], 5: full[2]}, 0.5
        )
        took = time.monotonic() - start
        assert silent == {2, 3, 5}
        assert 0.45 <= took < 1.2, took  # once for all three, not 0.5 s each
        assert silent_throughout({}, 0.5) == set()
    finally:
        for sock in held:
            sock.close()


def test_a_process_counts_as_halted_when_stopped_or_gone_on_this_machine():
    from ringreduce._comm.membership import processes

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from ringreduce._comm.membership import processes\n"
            "print(processes.mine(), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def settles(want: bool, process) -> bool:  # a signal takes effect a moment later
        deadline = time.monotonic() + 10
        while processes.halted(process) != want and time.monotonic() < deadline:
            time.sleep(0.01)
        return processes.halted(process) == want

    try:
        process = processes.parse(child.stdout.readline().split())
        assert process is not None and process.pid == child.pid
        assert not processes.halted(process)
        elsewhere = process._replace(machine="f" * len(process.machine))
        reused = process._replace(start=process.start + 1)
        assert processes.halted(reused)  # the pid is another process's now
        child.send_signal(signal.SIGSTOP)
        assert settles(True, process)
        assert not processes.halted(elsewhere)  # nothing to say about another machine
        child.send_signal(signal.SIGCONT)
        assert settles(False, process)
        child.kill()
        child.wait()
        assert processes.halted(process)
        assert processes.parse([]) is None and processes.parse(["x", "1", "m"]) is None
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.parametrize("links", ["shm", "tcp"])
def test_a_rank_resumed_after_the_others_left_it_out_is_refused(links, tmp_path):
    # Rank 0 is stopped; the others count it dead, shrink (on rank 1's store) and go on.
    # Resumed, rank 0 finds its calls failing and shrinks too: as the lowest rank it
    # hosts its own agreement, and without looking elsewhere it would count the others
    # dead in turn and go on as a world of one. It finds their decision on rank 1's
    # store, which the shrunk communicator keeps, and refuses.
    n = 3
    port = str(free_port())
    transport, hosts = _HOSTS[links]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                SCRIPT,
                str(r),
                str(n),
                port,
                transport,
                str(hosts),
                f"resume=0:{tmp_path}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"rank{r}.json").exists() for r in (1, 2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs[1:]), [
                p.communicate()[1][-2000:] for p in procs if p.poll() is not None
            ]
            time.sleep(0.05)
        survivors = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (1, 2)}
        procs[0].send_signal(signal.SIGCONT)
        out, err = procs[0].communicate(timeout=60)
    finally:
        (tmp_path / "done").touch()
        for p in procs:
            try:
                p.communicate(timeout=30)
            except (subprocess.TimeoutExpired, ValueError):
                pass
            if p.poll() is None:
                p.kill()
                p.communicate()
    for r, seen in survivors.items():
        assert seen["size"] == 2 and seen["new_rank"] == r - 1 and seen["ok"], seen
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    (resumed,) = lines[-1]["rounds"]
    assert "size" not in resumed, resumed  # no communicator of its own
    assert "left out of the agreement" in resumed["left_out"], resumed
    assert "agreed without it on rank 1" in resumed["left_out"], resumed
