"""The shared-memory transport: what runs where, nothing left behind, dead ranks named.

The collective suite itself runs on shared memory through the ``links`` fixture
(tests/test_collectives.py, tests/test_failures.py); these are the properties of the
transport on its own.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import ringreduce as rr

from _ranks import RankFailure, RankGroup, run_ranks

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="needs /proc: runs on Linux"
)


def _our_mappings() -> list:
    """Shared-memory segments of ringreduce mapped into this process."""
    with open("/proc/self/maps") as f:
        return [line for line in f if "memfd:ringreduce" in line]


def _names_and_mappings(comm):
    mapped = len(_our_mappings())
    x = comm.all_reduce(np.full(1 << 20, comm.rank + 1.0, dtype=np.float32))
    ok = bool(np.all(x == comm.world_size * (comm.world_size + 1) / 2))
    return comm.transport, comm.local_rank, comm.local_world_size, mapped, ok


@pytest.mark.parametrize("n", [2, 4])
def test_auto_on_one_host_is_shared_memory(n):
    with RankGroup(n, transport="shm") as group:
        for rank, (name, local, local_size, mapped, ok) in enumerate(
            group.run(_names_and_mappings)
        ):
            assert (name, local, local_size, ok) == ("shm", rank, n, True)
            # Our segment and every peer's, once for the collectives' links and once
            # for the point-to-point links (send/recv).
            assert mapped == 2 * n


def _close_then_look(comm):
    comm.all_reduce(np.ones(1000))
    comm.close()
    return len(_our_mappings())


def test_close_unmaps_every_segment():
    outcomes = run_ranks(3, _close_then_look, transport="shm")
    assert [o[1] for o in outcomes] == [0, 0, 0], [o[2] for o in outcomes]


# Open MPI's shared-memory files: an MPI job running beside the test (another test
# run, a benchmark) makes and removes them at any time.
_OTHERS = ("sm_segment.", "vader_segment.", "ompi.", "psm2")


def _dev_shm() -> set:
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith(_OTHERS)}


def _kill_during_collective(comm, victim, stamp_path):
    x = np.ones(1 << 16, dtype=np.float32)
    if comm.rank == victim:
        for _ in range(20):
            comm.all_reduce(x, out=x)
            x[:] = 1
        with open(stamp_path, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            comm.all_reduce(x, out=x)
            x[:] = 1
    except rr.RingReduceError as exc:
        return type(exc).__name__, exc.peer, time.time(), str(exc)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_killed_rank_is_named_on_every_survivor(n, tmp_path):
    before = _dev_shm()
    victim = n - 1
    stamp = str(tmp_path / "killed-at")
    with RankGroup(n, timeout=60, transport="shm") as group:
        outcomes = group.outcomes(_kill_during_collective, victim, stamp, timeout=120)
    with open(stamp) as f:
        killed_at = float(f.read())
    for rank, (status, value, tb) in enumerate(outcomes):
        if rank == victim:
            assert status == "dead"
            continue
        assert status == "ok", tb
        kind, peer, when, message = value
        assert (kind, peer) == ("PeerError", victim), message
        # Seen through the process's end (pidfd), not the 60 s timeout.
        assert when - killed_at < 10, f"named {when - killed_at:.2f} s after the kill"
    assert _dev_shm() == before  # memfds: nothing to clean up, even after kill -9


def test_shm_refuses_ranks_on_other_hosts():
    with pytest.raises(RankFailure) as failure:
        run_ranks(2, _close_then_look, transport="shm-split", init_timeout=20)
    for status, value, tb in failure.value.outcomes:
        assert status == "err" and isinstance(value, ValueError), tb
        assert "every rank on one host" in str(value)


def _messages_over_many_slots(comm):
    """Collectives and messages whose segments span several slots each."""
    from test_collectives import _all_gather, _reduce_scatter
    from test_collectives_more import _p2p_ring

    failures = list(_p2p_ring(comm, "float32"))
    failures += _reduce_scatter(comm, "float64") + _all_gather(comm, "int8")
    return failures


@pytest.mark.parametrize("transport", ["shm", "shm+tcp"])
def test_segments_larger_than_a_slot(transport):
    # 4 KiB slots under 128 KiB segments: every message spans 32 slots (8 in the ring),
    # so a receiver reads a slot's fields only before handing the slot back.
    env = {"RINGREDUCE_SHM_SLOT_BYTES": "4096"}
    with RankGroup(3, transport=transport, env=env) as group:
        assert group.run(_messages_over_many_slots) == [[], [], []]


_PINNED_RANK = """
import os, sys
import numpy as np
import ringreduce as rr

rank, cpu, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {cpu})
with rr.init("shm", rank=rank, world_size=2, store_dir=where, timeout=30) as comm:
    assert (comm.all_reduce(np.ones(4, np.float32)) == 2).all()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin ranks to")
@pytest.mark.parametrize("spread", [True, False])
def test_waits_spin_when_the_local_ranks_have_a_core_each(spread, tmp_path):
    # Ranks bound one per core (mpirun --bind-to core) each see one CPU in their own
    # mask: the union of the local ranks' masks says whether they share cores.
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0))[:2]
    env = dict(os.environ, RINGREDUCE_DEBUG="algorithm")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PINNED_RANK,
                str(r),
                str(cpus[r] if spread else cpus[0]),
                str(tmp_path),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    want = "on 2 CPU(s): waits spin" if spread else "on 1 CPU(s): waits yield"
    for r, (_, err) in enumerate(outs):
        assert f"rank {r}: shared memory: 2 local rank(s) {want}" in err, err[-2000:]


def _segments_held() -> list:
    """(bytes of memory it holds, its size) of each ringreduce segment mapped here: the
    blocks of the file behind the mapping, whoever reserved them (/proc/self/map_files
    needs CAP_SYS_ADMIN: PermissionError without it)."""
    held = []
    for line in _our_mappings():
        st = os.stat(f"/proc/self/map_files/{line.split()[0]}")
        held.append((st.st_blocks * 512, st.st_size))
    return held


def _memory_as_messages_go(comm):
    """The share of each peer's segment holding memory after init, then after all_to_alls
    that write every peer's inbox (a slot's first page, then whole slots, then a page
    again), with every result checked."""
    n, rank = comm.world_size, comm.rank
    try:
        after_init = [held / size for held, size in _segments_held()]
    except PermissionError:
        return None
    wrong = []
    for count in (2, 50_000, 1, 300_000, 7):  # float64 per peer: from 8 B to 2.4 MB
        x = np.concatenate([np.full(count, rank * 1000.0 + to) for to in range(n)])
        got = comm.all_to_all(x)
        want = np.concatenate([np.full(count, frm * 1000.0 + rank) for frm in range(n)])
        if not np.array_equal(got, want):
            wrong.append(count)
    after = [held / size for held, size in _segments_held()]
    return after_init, after, wrong


def test_a_rank_holds_memory_for_the_peers_that_send_to_it():
    # 5 ranks: each segment has an inbox per rank. Its two ring neighbours reserve
    # theirs when the communicator is made, so that an all_reduce never reserves memory
    # in the middle of a call; the others reserve pages as they first write them. A
    # segment used to be reserved whole (5 inboxes) at once, 25 ranks' worth in all.
    n = 5
    with RankGroup(n, transport="shm") as group:
        outcomes = group.run(_memory_as_messages_go)
        if None in outcomes:
            pytest.skip("reading /proc/self/map_files needs CAP_SYS_ADMIN")
        for rank, (after_init, after, wrong) in enumerate(outcomes):
            assert wrong == [], (rank, wrong)
            # Its own segment and every peer's, for the collectives and for send/recv.
            assert len(after_init) == 2 * n, (rank, after_init)
            for share in after_init:
                assert 1.5 / n < share < 2.5 / n, (rank, after_init)
            for share in after:
                assert share <= 1.0, (rank, after)
            assert max(after) > 3 / n, (rank, after)  # all_to_all wrote every inbox
