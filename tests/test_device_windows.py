"""all_reduce over device windows (comm.empty(..., device="cuda")), run on the fake device.

With RINGREDUCE_TEST_FAKE_DEVICE=1 the engine's Device is the CPU emulation of
csrc/executor/fake_device.cc, whose shared allocations are shared-memory segments and
whose handles are their records: each rank's process maps its peers' "device" memory
as CUDA IPC maps a GPU's, so the whole protocol runs here, the device's ops queued on
its lanes and run as late as their events allow. The tests read and write the windows
through their addresses, which on the fake device are host memory.

The risks are the host windows' (test_windows.py) and the device's own: a rank whose
caller's stream has not reached the call yet when its peers read its input (the wait
before `located`; the fake device runs work a test queued on the caller's stream only
once something waits for it), a chunk not yet on every output when a rank says `done` (the sync
after the copies), and ranks that disagree on where their windows are.
"""

from __future__ import annotations

import os
import time

import _device_window_ranks as dw
import numpy as np
import pytest
from _device_window_ranks import host
from _fake_cuda import FAKE_DEVICE_ENV, fake
from test_windows import window_loop_until_error

import ringreduce as rr
from ringreduce._comm.core.windows import cuda_index

from _ranks import native_stderr, run_ranks, survivors


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_dtype_and_op_matches_numpy_bit_for_bit(group_factory, n):
    group = group_factory(n, fake_device=True, transport="shm")
    for bad, calls, ran in group.run(dw.exact, timeout=300):
        assert bad == []
        assert ran == calls > 0


@pytest.mark.parametrize("n", [2, 3])
def test_float_sums_have_rank_order_bits_on_every_rank(group_factory, n):
    for matches, same_as_rank0 in group_factory(n, fake_device=True, transport="shm").run(
        dw.float_order
    ):
        assert matches and same_as_rank0


@pytest.mark.parametrize("n", [2, 3])
def test_16_bit_floats_accumulate_in_float32_and_round_once(group_factory, n):
    """One kernel reads every rank's input, so float16 and bfloat16 sums and averages
    are float32's, rounded once: the host windows' bits, the same on every rank. At 3
    ranks the data make that differ from rounding at every hop (at 2 the two agree)."""
    for bad, same, telling in group_factory(n, fake_device=True, transport="shm").run(dw.half_sums):
        assert bad == [] and same
        if n >= 3:
            assert all(telling)


@pytest.mark.parametrize("n", [2, 4])
def test_buffers_rewritten_between_calls_never_corrupt_a_sum(group_factory, n):
    group = group_factory(n, fake_device=True, transport="shm")
    assert group.run(dw.reuse_under_pressure, 60, timeout=240) == ["ok"] * n


def _after_the_callers_stream(comm):
    """Each input is written on the caller's stream (the fake device's emulation runs it
    only once something waits for that stream) just before the call: a rank must wait
    for it before it says its buffers are ready, or a peer reads them stale."""
    from ringreduce import _core

    n, r = comm.world_size, comm.rank
    stream = 0x5EED
    dev = comm.empty(4096, np.float32, device="cuda")
    h = host(dev)
    before = comm.stats()["all_reduce_algorithms"]["window"]
    for i in range(20):
        h[:] = -1  # stale: what a peer reads if it comes too early
        _core.testing.fake_stream_write(
            stream, h.ctypes.data, np.full(h.size, r + 1 + i, h.dtype).tobytes()
        )
        x = fake(h, stream=stream)
        if i % 2:
            comm.all_reduce(x, out=x, async_op=True).wait()
        else:
            comm.all_reduce(x, out=x)
        want = n * (n + 1) / 2 + n * i
        if not np.all(h == want):
            return f"call {i}: {np.unique(h)[:4].tolist()} where {want} was due"
    return comm.stats()["all_reduce_algorithms"]["window"] - before


@pytest.mark.parametrize("n", [2, 3])
def test_a_call_waits_for_the_callers_stream_before_peers_read_its_buffers(group_factory, n):
    group = group_factory(n, fake_device=True, transport="shm")
    assert group.run(_after_the_callers_stream) == [20] * n


def _mixed(comm):
    """Device window calls, async ones too, between staged device calls and host calls,
    and host windows beside device windows."""
    n, r = comm.world_size, comm.rank
    dev = comm.empty(3000, np.float32, device="cuda")
    hw = comm.empty(4000, np.float32)  # above the host windows' smallest size
    before = comm.stats()["all_reduce_algorithms"]["window"]
    for i in range(12):
        host(dev)[:] = r + i
        if i % 2:
            comm.all_reduce(dev, out=dev)
        else:
            comm.all_reduce(dev, out=dev, async_op=True).wait()
        hw[:] = r - i
        comm.all_reduce(hw, out=hw)
        plain = comm.all_reduce(np.full(10, r, np.float32))
        staged = fake(np.full(5000, r, np.float32))  # device memory outside any window
        comm.all_reduce(staged, out=staged)
        if not np.all(staged.array == n * (n - 1) / 2):
            return f"round {i}: staged device call wrong"
        if not np.all(host(dev) == n * i + n * (n - 1) / 2):
            return f"round {i}: device window wrong"
        if not (np.all(hw == n * (n - 1) / 2 - n * i) and np.all(plain == n * (n - 1) / 2)):
            return f"round {i}: host calls wrong"
    return comm.stats()["all_reduce_algorithms"]["window"] - before


def test_device_windows_interleave_with_host_windows_and_other_calls(group_factory):
    assert group_factory(3, fake_device=True, transport="shm").run(_mixed) == [24] * 3


def _where_no_shared_memory(comm):
    x = comm.empty((3, 4), np.float64, device="cuda")
    host(x)[:] = comm.rank + 1
    comm.all_reduce(x, out=x)
    return (
        type(x).__name__,
        x.window.id,
        float(host(x)[0]),
        comm.stats()["all_reduce_algorithms"]["window"],
    )


def test_over_tcp_it_is_device_memory_of_the_rank_and_all_reduce_stages_it(group_factory):
    for kind, window_id, value, window in group_factory(2, fake_device=True, transport="tcp").run(
        _where_no_shared_memory
    ):
        assert (kind, window_id, value, window) == ("DeviceWindowArray", 0, 3.0, 0)


def _device_against_host_windows(comm):
    """Every rank makes a device window and a host window; rank 0 passes its device
    window, rank 1 its host window."""
    start = time.monotonic()
    dev = comm.empty(10000, np.float32, device="cuda")
    hst = comm.empty(10000, np.float32)
    x = dev if comm.rank == 0 else hst
    try:
        comm.all_reduce(x, out=x)
        return "no error", time.monotonic() - start
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start


def _made_in_different_memory(comm):
    try:
        comm.empty(100, np.float32, device="cuda" if comm.rank == 0 else None)
        return "no error"
    except rr.RingReduceError as exc:
        return str(exc)


def test_a_window_made_in_device_memory_on_one_rank_and_host_on_another_raises_on_both():
    for status, message, tb in run_ranks(
        2, _made_in_different_memory, transport="shm", env=FAKE_DEVICE_ENV, timeout=90
    ):
        assert status == "ok", tb
        assert "made window 1 in" in message and "device memory (cuda:0)" in message, message
        assert "host memory" in message, message


def test_device_windows_against_host_windows_is_a_mismatch_on_every_rank():
    outcomes = run_ranks(
        2, _device_against_host_windows, transport="shm", env=FAKE_DEVICE_ENV, timeout=90
    )
    kinds = []
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        (kind, message), seconds = value
        assert seconds < 15, f"rank {rank} took {seconds:.1f} s: the timeout, not the check"
        kinds.append(kind)
        if kind == "MismatchError":
            assert "device windows (cuda:0)" in message and "host windows" in message, message
        else:
            assert kind == "PeerError", (rank, message)
    assert "MismatchError" in kinds


def _one_window_one_plain(comm):
    """Rank 1 passes device memory outside any window: it runs the staged path, rank 0
    the window path, and the headers say so."""
    start = time.monotonic()
    x = comm.empty(1000, np.float32, device="cuda")
    arg = x if comm.rank == 0 else fake(np.zeros(1000, np.float32))
    try:
        comm.all_reduce(arg, out=arg)
        return "no error", time.monotonic() - start
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start


def test_a_rank_outside_device_windows_is_a_mismatch_on_every_rank():
    outcomes = run_ranks(2, _one_window_one_plain, transport="shm", env=FAKE_DEVICE_ENV)
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        (kind, message), seconds = value
        assert seconds < 15, f"rank {rank} took {seconds:.1f} s"
        assert kind in ("MismatchError", "PeerError"), (rank, kind, message)
        if kind == "MismatchError":
            assert "window" in message, message


def _peer_window_gone(comm):
    """Rank 1 drops device window 1 and uses window 2; rank 0 uses window 1: rank 1 no
    longer maps rank 0's window 1, refuses before anyone touches a buffer, and rank 0
    hears of it at once."""
    import gc

    start = time.monotonic()
    a = comm.empty(4096, np.float32, device="cuda")
    b = comm.empty(4096, np.float32, device="cuda")
    host(a)[:] = 5
    if comm.rank == 1:
        a = b
        host(a)[:] = 5
        gc.collect()
    try:
        comm.all_reduce(a, out=a)
        return "no error", time.monotonic() - start, None
    except rr.RingReduceError as exc:
        return (type(exc).__name__, str(exc)), time.monotonic() - start, host(a).copy()


def test_a_device_window_freed_on_one_rank_is_refused_and_nothing_is_written():
    outcomes = run_ranks(2, _peer_window_gone, transport="shm", env=FAKE_DEVICE_ENV, timeout=90)
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        outcome, seconds, data = value
        assert outcome != "no error", rank
        assert seconds < 15, f"rank {rank} took {seconds:.1f} s"
        assert np.all(data == 5), f"rank {rank}'s buffer was written: {data[:4]}"
    (_, m0), _, _ = outcomes[0][1]
    (_, m1), _, _ = outcomes[1][1]
    assert "window 1, which rank 1 no longer holds" in m1, m1
    assert "rank 1" in m0, m0


def test_a_rank_killed_between_device_window_calls_is_named_on_every_survivor():
    victim = 1
    outcomes = survivors(
        3, window_loop_until_error, victim, env=FAKE_DEVICE_ENV, args=("cuda",)
    ).values()
    for kind, peer, seconds in outcomes:
        assert (kind, peer) == ("PeerError", victim) and seconds < 15, (kind, peer, seconds)


def _beyond_one_kernel(comm):
    """Device windows on more ranks than one reduce_all kernel takes addresses for:
    the sum, and which algorithm ran."""
    n, r = comm.world_size, comm.rank
    x = comm.empty(5000, np.float32, device="cuda")
    dw.write(x, np.full(5000, r + 1, np.float32))
    before = dict(comm.stats()["all_reduce_algorithms"])
    with native_stderr() as said:
        comm.all_reduce(x, out=x)
    ran = {k: v - before.get(k, 0) for k, v in comm.stats()["all_reduce_algorithms"].items()}
    got = dw.read(x, np.float32, 5000)
    return bool((got == n * (n + 1) // 2).all()), {k: v for k, v in ran.items() if v}, said()


def test_more_ranks_than_one_kernel_takes_are_staged():
    """17 ranks on a host: one kernel carries at most 16 ranks' addresses, so every rank
    stages its device windows through the host (the same choice everywhere: no
    mismatch), and the sum is right. The algorithm log says why the windows were passed
    over."""
    env = dict(FAKE_DEVICE_ENV, RINGREDUCE_DEBUG="algorithm")
    outcomes = run_ranks(17, _beyond_one_kernel, transport="shm", env=env, timeout=240)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        right, ran, said = value
        assert right and "window" not in ran and sum(ran.values()) == 1, ran
        assert (
            "not the window path: 17 ranks share this host, more than the 16 whose device "
            "buffers one kernel reads, so device buffers are staged; " in said
        ), said


def _without_a_device(comm):
    try:
        comm.empty(16, np.float32, device="cuda")
        return "no error"
    except (TypeError, rr.RingReduceError) as exc:
        return type(exc).__name__, str(exc)


def test_without_a_gpu_every_rank_raises_saying_why():
    if rr.build_info().get("cuda") and rr.cuda_available():  # pragma: no cover - GPU hosts
        pytest.skip("a GPU is usable here")
    for status, value, tb in run_ranks(2, _without_a_device, transport="shm"):
        assert status == "ok", tb
        assert value != "no error"
        kind, message = value
        assert "CUDA" in message and "window" in message, message


def test_device_names():
    assert cuda_index(None) is None and cuda_index("cpu") is None
    assert cuda_index("cuda:3") == 3 and cuda_index(2) == 2
    assert cuda_index("cuda") == 0  # no torch CUDA here: the first device
    for bad in ("tpu", "cuda:x", -1):
        with pytest.raises(ValueError, match="device"):
            cuda_index(bad)


def _on_own_gpus(comm):
    """Each rank on a (fake) GPU of its own: with peer access the windows are shared and
    take the window path; without it (RINGREDUCE_TEST_FAKE_PEER_ACCESS=0) every rank's
    window is its own memory, and the all_reduce is staged, with the same sums."""
    n, r = comm.world_size, comm.rank
    x = comm.empty(5000, np.float64, device=f"cuda:{r}")
    host(x)[:] = np.arange(5000) * (r + 1)
    before = comm.stats()["all_reduce_algorithms"]["window"]
    comm.all_reduce(x, out=x)
    right = bool(np.array_equal(host(x), np.arange(5000) * (n * (n + 1) // 2)))
    used = comm.stats()["all_reduce_algorithms"]["window"] - before
    return right, x.shared, x.window.unshared_reason, used, x.device.id


@pytest.mark.parametrize("peer_access", [True, False])
def test_ranks_on_gpus_without_peer_access_get_their_own_memory_and_staging(peer_access):
    env = dict(FAKE_DEVICE_ENV, RINGREDUCE_TEST_FAKE_PEER_ACCESS="1" if peer_access else "0")
    for rank, (status, value, tb) in enumerate(
        run_ranks(3, _on_own_gpus, transport="shm", env=env, timeout=90)
    ):
        assert status == "ok", tb
        right, shared, why, used, device = value
        assert right and device == rank
        if peer_access:
            assert (shared, why, used) == (True, "", 1)
        else:
            assert (shared, used) == (False, 0)
            assert "no peer access to device" in why and "is not shared: rank" in why, why


def _freed_once_every_peer_closed(comm):
    """CUDA leaves freeing memory a peer still maps undefined: rank 0 drops its window
    first, and its memory waits (retired) until rank 1 has dropped its own, closing its
    mapping of rank 0's; the next window made frees it."""
    import gc

    from ringreduce import _core

    x = comm.empty(1000, np.float32, device="cuda")
    seen = []
    if comm.rank == 0:
        del x
        gc.collect()
        seen.append(_core.testing.retired_device_windows())
    comm.barrier()
    if comm.rank == 1:
        del x
        gc.collect()
    comm.barrier()
    y = comm.empty(10, np.float32, device="cuda")  # sweeps the retired list
    seen.append(_core.testing.retired_device_windows())
    del y  # on both ranks before the barrier: whoever dropped first waits for the other
    gc.collect()
    comm.barrier()
    comm.close()  # sweeps: every peer has closed by now
    seen.append(_core.testing.retired_device_windows())
    return seen


def test_a_device_window_is_freed_only_once_every_peer_closed_its_mapping():
    outcomes = run_ranks(2, _freed_once_every_peer_closed, transport="shm", env=FAKE_DEVICE_ENV)
    (s0, v0, tb0), (s1, v1, tb1) = outcomes
    assert s0 == "ok" and s1 == "ok", (tb0, tb1)
    assert v0 == [1, 0, 0], v0  # retired while rank 1 mapped it, freed after
    assert v1 == [0, 0], v1  # rank 0 closed its mapping first: freed at once


_EXPLAINED = """
import numpy as np, ringreduce as rr
comm = rr.init()
x = comm.empty(100, np.float32, device="cuda")
comm.all_reduce(x, out=x)
comm.close()
"""


def test_the_algorithm_log_says_the_gpus_read_each_other_in_place():
    import subprocess
    import sys

    env = dict(os.environ, RINGREDUCE_DEBUG="algorithm", **FAKE_DEVICE_ENV)
    out = subprocess.run(
        [sys.executable, "-m", "ringreduce", "launch", "-n", "2", "--transport", "shm", "--"]
        + [sys.executable, "-c", _EXPLAINED],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stdout + out.stderr
    assert "is in a device window (comm.empty(..., device=0))" in said, said[-2000:]
    assert "the GPUs read each other's buffers in place: window" in said, said[-2000:]
