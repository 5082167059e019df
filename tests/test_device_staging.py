"""The staging pipeline for CUDA arrays, run on the CPU.

With RINGREDUCE_TEST_FAKE_DEVICE=1 the engine's Device is the CPU emulation of
csrc/engine/fake_device.cc: "device" memory is host memory, copies are memcpy,
reductions the CPU kernels, and queued work runs as late as its events allow,
so a missing wait or a slot reused too early shows up as wrong data. The
arrays are FakeCudaArray (a numpy array behind ``__cuda_array_interface__``),
so every call takes the CUDA path from the Python API down, through the same
pipeline code a GPU runs: staging slots, lookahead, lane ordering, segment
offsets, the owner-only avg. Results are compared bit for bit against numpy
references across 2-4 ranks, with one-element segments, odd segment sizes and
odd counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from _fake_cuda import FAKE_DEVICE_ENV, FakeCudaArray, fake

import ringreduce as rr
from ringreduce._arrays.buffer import HOST, describe
from ringreduce._arrays.cuda import cuda_available

from _data import (
    DTYPES,
    FLOATING,
    OPS,
    contribution,
    expect_errors,
    expected,
    np_dtype,
    same_bits,
    sizes_for,
)
from _ranks import RankGroup, run_ranks

# (segment bytes, staging bytes): one element per segment, 40 bytes (a whole
# number of elements of every dtype, and not of 16), and the default (one
# segment per chunk at these counts). The default staging copies about a
# quarter of a step at a time (batches of several segments); staging of one
# segment makes every segment its own copy, so the slots wrap around many times
# per chunk; 120 bytes, batches of three 40-byte segments.
SEGMENTS = {
    "1-element": (1, 0),
    "1-element-per-copy": (1, 1),
    "40-byte": (40, 0),
    "40-byte-3-per-copy": (40, 120),
    "default": (0, 0),
}

_groups: dict = {}
# Groups kept alive at once, the least recently used closed first: the parameters
# make 30 of them, about 90 processes, and under the sanitizers (.ci/sanitizers.sh)
# each rank holds some 300 MB, more than the machine has.
LIVE_GROUPS = 8


@pytest.fixture(scope="module")
def fake_group():
    """fake_group(n, segment_bytes or (segment_bytes, staging_bytes), transport="tcp")
    -> ranks whose engine uses the fake device (0: the default)."""

    def get(n: int, segment, transport: str = "tcp") -> RankGroup:
        segment_bytes, staging_bytes = segment if isinstance(segment, tuple) else (segment, 0)
        key = (n, segment_bytes, staging_bytes, transport)
        if key in _groups:
            _groups[key] = _groups.pop(key)  # the most recently used last
        else:
            while len(_groups) >= LIVE_GROUPS:
                _groups.pop(next(iter(_groups))).close()
            env = dict(FAKE_DEVICE_ENV)
            if segment_bytes:
                env["RINGREDUCE_SEGMENT_BYTES"] = str(segment_bytes)
            if staging_bytes:
                env["RINGREDUCE_DEVICE_STAGING_BYTES"] = str(staging_bytes)
            if "shm" in transport:
                # Over shared memory, segments go between the device and the inboxes
                # directly (off by default); the pinned path is TCP's, and
                # test_shared_memory_messages_land_on_the_device_in_place's.
                env["RINGREDUCE_DEVICE_IN_PLACE"] = "1"
            _groups[key] = RankGroup(n, transport=transport, env=env)
        return _groups[key]

    yield get
    for group in _groups.values():
        group.close()
    _groups.clear()


def _counts(n: int, segment: tuple) -> list:
    # One-element segments make every element a round trip; keep those calls short.
    return [c for c in sizes_for(n) if c < 200] if segment[0] == 1 else sizes_for(n)


def _poison(shape, dtype: str) -> np.ndarray:
    return np.full(shape, 99, dtype=np_dtype(dtype))


# ---- rank-side functions (module level so they pickle by reference) -------


def _all_reduce(comm, dtype, counts):
    failures = []
    n, r = comm.world_size, comm.rank
    for op in OPS:
        if op == "avg" and dtype not in FLOATING:
            continue
        for count in counts:
            want = expected(n, count, dtype, op)
            x = contribution(r, count, dtype, op)
            out = _poison(count, dtype)
            if comm.all_reduce(fake(x), op=op, out=fake(out)).array is not out:
                failures.append(f"{op} count={count}: out= is not the result")
            if not same_bits(out, want):
                failures.append(f"out-of-place {op} count={count}")
            if not same_bits(x, contribution(r, count, dtype, op)):
                failures.append(f"out-of-place {op} count={count} modified its input")
            dx = fake(x)
            comm.all_reduce(dx, op=op, out=dx)
            if not same_bits(x, want):
                failures.append(f"in-place {op} count={count}")
    return failures


def _reduce_scatter(comm, dtype, counts):
    failures = []
    n, r = comm.world_size, comm.rank
    for op in ("sum", "prod", "max", "avg"):
        if op == "avg" and dtype not in FLOATING:
            continue
        for count in counts:
            start, stop = rr.chunk_bounds(count, n, r)
            out = _poison(stop - start, dtype)
            comm.reduce_scatter(fake(contribution(r, count, dtype, op)), op=op, out=fake(out))
            if not same_bits(out, expected(n, count, dtype, op)[start:stop]):
                failures.append(f"{op} count={count}")
    return failures


def _all_gather(comm, dtype, counts):
    failures = []
    n, r = comm.world_size, comm.rank
    for count in counts:
        want = np.stack([contribution(i, count, dtype, "sum") for i in range(n)])
        out = _poison((n, count), dtype)
        comm.all_gather(fake(contribution(r, count, dtype, "sum")), out=fake(out))
        if not same_bits(out, want):
            failures.append(f"count={count}")
        # In place: the input already sits in its row of the output.
        out = _poison((n, count), dtype)
        out[r] = contribution(r, count, dtype, "sum")
        comm.all_gather(fake(out[r]), out=fake(out))
        if not same_bits(out, want):
            failures.append(f"in-place count={count}")
    return failures


def _broadcast(comm, dtype, counts):
    failures = []
    n, r = comm.world_size, comm.rank
    for root in range(n):
        for count in counts:
            x = contribution(r, count, dtype, "sum")
            if comm.broadcast(fake(x), root=root).array is not x:
                failures.append(f"root={root} count={count}: x is not the result")
            if not same_bits(x, contribution(root, count, dtype, "sum")):
                failures.append(f"root={root} count={count}")
    return failures


def _rooted_and_all_to_all(comm, dtype, counts):
    """reduce, gather, scatter and all_to_all on device memory, out= given."""
    failures = []
    n, r = comm.world_size, comm.rank
    for root in sorted({0, n - 1}):
        for count in counts:
            want = expected(n, count, dtype, "max")
            out = _poison((count,), dtype)
            comm.reduce(fake(contribution(r, count, dtype, "max")), "max", root, out=fake(out))
            if r == root and not same_bits(out, want):
                failures.append(f"reduce root={root} count={count}")
            rows = _poison((n, count), dtype)
            comm.gather(fake(contribution(r, count, dtype, "sum")), root, out=fake(rows))
            stacked = np.stack([contribution(i, count, dtype, "sum") for i in range(n)])
            if r == root and not same_bits(rows, stacked):
                failures.append(f"gather root={root} count={count}")
            mine = _poison((count,), dtype)
            comm.scatter(fake(stacked) if r == root else None, root, out=fake(mine))
            if not same_bits(mine, stacked[r]):
                failures.append(f"scatter root={root} count={count}")
    for count in counts:
        x = np.concatenate([contribution(r * n + d, count, dtype, "sum") for d in range(n)])
        out = _poison((n * count,), dtype)
        comm.all_to_all(fake(x), out=fake(out))
        want = np.concatenate([contribution(s * n + r, count, dtype, "sum") for s in range(n)])
        if not same_bits(out, want):
            failures.append(f"all_to_all count={count}")
    return failures


def _random_float32(comm, count, seed):
    n, r = comm.world_size, comm.rank
    parts = [np.random.default_rng(seed + i).standard_normal(count) for i in range(n)]
    got = np.empty(count, dtype=np.float32)
    comm.all_reduce(fake(parts[r].astype(np.float32)), out=fake(got))
    inputs = [p.astype(np.float32).astype(np.float64) for p in parts]
    ref = np.sum(inputs, axis=0)
    # Each of the n-1 hops rounds once to float32: |error| <= (n-1) eps sum|x|.
    bound = (n - 1) * float(np.finfo(np.float32).eps) * np.sum(np.abs(inputs), axis=0)
    return bool(np.all(np.abs(got.astype(np.float64) - ref) <= bound))


def _async_calls_in_flight(comm):
    # Several calls queued at once reuse the staging memory one after another.
    n, r = comm.world_size, comm.rank
    counts = [5, 4099, 1, 333, 0, 2048]
    xs = [contribution(r, c, "float64", "sum") for c in counts]
    outs = [np.empty(c, dtype=np.float64) for c in counts]
    works = [comm.all_reduce(fake(x), out=fake(o), async_op=True) for x, o in zip(xs, outs)]
    for w in works:
        w.wait()
    return all(same_bits(o, expected(n, c, "float64", "sum")) for o, c in zip(outs, counts))


def _after_the_callers_stream(comm, counts):
    # Each input is written on the caller's stream (the fake device's emulation, which
    # runs it only once something waits for it) just before its call: every path must
    # wait for that stream before it reads the input, synchronous calls and async ones.
    from ringreduce import _core

    n, r = comm.world_size, comm.rank
    stream = 0x5EED
    wrong = []
    for i, c in enumerate(counts):
        x = np.full(c, -1.0, np.float32)  # stale: what a call reads if it comes too early
        out = np.full(c, -7.0, np.float32)
        _core.testing.fake_stream_write(
            stream, x.ctypes.data, np.full(c, r + 1 + i, np.float32).tobytes()
        )
        args = (fake(x, stream=stream),)
        if i % 2:
            comm.all_reduce(*args, out=fake(out, stream=stream), async_op=True).wait()
        else:
            comm.all_reduce(*args, out=fake(out, stream=stream))
        if not np.all(out == n * (n + 1) / 2 + n * i):
            wrong.append((c, i, np.unique(out)[:4].tolist()))
    return wrong


def _device_and_host_ranks_meet(comm, counts):
    # Same bytes on the wire: even ranks pass "device" arrays, odd ranks numpy. On
    # shared memory the smallest calls go through the bulletin, whichever the arrays.
    n, r = comm.world_size, comm.rank
    failures = []
    for count in counts:
        for op in ("sum", "avg", "max"):
            x = contribution(r, count, "float32", op)
            out = np.empty_like(x)
            comm.all_reduce(
                fake(x) if r % 2 == 0 else x, op=op, out=fake(out) if r % 2 == 0 else out
            )
            if not same_bits(out, expected(n, count, "float32", op)):
                failures.append(f"{op} count={count}")
    return failures


def _every_collective_mixed(comm, counts):
    # Even ranks pass "device" arrays, odd ranks numpy, in every collective: no path
    # may depend on where one rank's arrays live (each rank's choice must be its
    # peers', or the host ranks misread the stream and the device ranks wait).
    n, r = comm.world_size, comm.rank
    arr = fake if r % 2 == 0 else (lambda a: a)
    failures = []

    def poison(shape):
        return np.full(shape, 99, dtype=np.float32)

    def mine(i, count, op="sum"):
        return contribution(i, count, "float32", op)

    for count in counts:
        stacked = np.stack([mine(i, count) for i in range(n)])
        out = poison(count)
        comm.all_reduce(arr(mine(r, count)), out=arr(out))
        if not same_bits(out, expected(n, count, "float32", "sum")):
            failures.append(f"all_reduce count={count}")
        start, stop = rr.chunk_bounds(count, n, r)
        block = poison(stop - start)
        comm.reduce_scatter(arr(mine(r, count)), out=arr(block))
        if not same_bits(block, expected(n, count, "float32", "sum")[start:stop]):
            failures.append(f"reduce_scatter count={count}")
        rows = poison((n, count))
        comm.all_gather(arr(mine(r, count)), out=arr(rows))
        if not same_bits(rows, stacked):
            failures.append(f"all_gather count={count}")
        for root in range(n):
            x = mine(r, count)
            comm.broadcast(arr(x), root=root)
            if not same_bits(x, stacked[root]):
                failures.append(f"broadcast root={root} count={count}")
            out = poison(count)
            comm.reduce(arr(mine(r, count, "max")), "max", root, out=arr(out))
            if r == root and not same_bits(out, expected(n, count, "float32", "max")):
                failures.append(f"reduce root={root} count={count}")
            rows = poison((n, count))
            comm.gather(arr(mine(r, count)), root, out=arr(rows))
            if r == root and not same_bits(rows, stacked):
                failures.append(f"gather root={root} count={count}")
            part = poison(count)
            comm.scatter(arr(stacked) if r == root else None, root, out=arr(part))
            if not same_bits(part, stacked[r]):
                failures.append(f"scatter root={root} count={count}")
        x = np.concatenate([mine(r * n + d, count) for d in range(n)])
        out = poison(n * count)
        comm.all_to_all(arr(x), out=arr(out))
        if not same_bits(out, np.concatenate([mine(q * n + r, count) for q in range(n)])):
            failures.append(f"all_to_all count={count}")
    return failures


def _bytes_on_the_wire(comm, count):
    # The staged path sends exactly what the host ring sends.
    x = np.ones(count, dtype=np.float32)
    before = comm.stats()["bytes_sent"]
    comm.all_reduce(x)
    host = comm.stats()["bytes_sent"] - before
    before = comm.stats()["bytes_sent"]
    comm.all_reduce(fake(x), out=fake(np.empty_like(x)))
    return host, comm.stats()["bytes_sent"] - before


def _bad_arguments_then_good_call(comm):
    x = np.ones(10, dtype=np.float32)
    cases = [
        (lambda: comm.all_reduce(x, out=fake(np.empty_like(x))), ValueError),  # host x, device out
        (lambda: comm.all_reduce(fake(x), out=np.empty_like(x)), ValueError),  # device x, host out
        (lambda: comm.all_reduce(fake(x), out=fake(np.empty_like(x), device=1)), ValueError),
        (lambda: comm.all_reduce(fake(x), out=fake(np.empty(9, np.float32))), ValueError),
        (lambda: comm.all_reduce(fake(x), out=fake(np.empty(10, np.float64))), TypeError),
        (lambda: comm.all_reduce(fake(x), out=fake(np.empty(20, np.float32)[::2])), ValueError),
        (lambda: comm.all_reduce(fake(x), out=fake(np.empty_like(x), readonly=True)), ValueError),
        (lambda: comm.all_reduce(fake(np.ones(20, np.float32)[::2])), ValueError),  # strided
        (lambda: comm.all_reduce(fake(np.ones(3, np.complex64)), out=fake(x)), TypeError),
        (lambda: comm.all_reduce(fake(np.ones(3, np.int32)), op="avg"), ValueError),
        (lambda: comm.all_reduce(fake(x)), TypeError),  # cannot allocate like a FakeCudaArray
        (lambda: comm.all_gather(fake(x)), TypeError),
        (lambda: comm.broadcast(fake(x, readonly=True), root=(comm.rank + 1) % 2), ValueError),
        (lambda: _partial_overlap(comm), ValueError),
    ]
    errors = expect_errors(cases)
    y = np.full(5, comm.rank, dtype=np.int64)
    comm.all_reduce(fake(y), out=fake(y))
    if not np.all(y == sum(range(comm.world_size))):
        errors.append("the communicator is broken after bad input")
    return errors


def _partial_overlap(comm):
    big = np.ones(20, dtype=np.float32)
    return comm.all_reduce(fake(big[:10]), out=fake(big[1:11]))


# ---- tests -------------------------------------------------------------------


# Over TCP every segment goes through the pinned slots; over shared memory (with
# RINGREDUCE_DEVICE_IN_PLACE=1, fake_group) straight between the device and the
# inboxes' slots.
@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("segment", SEGMENTS.values(), ids=SEGMENTS.keys())
@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce(fake_group, n, segment, transport):
    counts = _counts(n, segment)
    for dtype in DTYPES:
        got = fake_group(n, segment, transport).run(_all_reduce, dtype, counts)
        assert got == [[]] * n, dtype


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("segment", SEGMENTS.values(), ids=SEGMENTS.keys())
@pytest.mark.parametrize("n", [2, 3, 4])
def test_reduce_scatter(fake_group, n, segment, transport):
    counts = _counts(n, segment)
    for dtype in ("float16", "bfloat16", "float64", "int8", "int64"):
        got = fake_group(n, segment, transport).run(_reduce_scatter, dtype, counts)
        assert got == [[]] * n, dtype


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("segment", SEGMENTS.values(), ids=SEGMENTS.keys())
@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_gather_and_broadcast(fake_group, n, segment, transport):
    counts = _counts(n, segment)
    for dtype in ("bfloat16", "float32", "uint8", "int64"):
        group = fake_group(n, segment, transport)
        assert group.run(_all_gather, dtype, counts) == [[]] * n, dtype
        assert group.run(_broadcast, dtype, counts) == [[]] * n, dtype


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("segment", SEGMENTS.values(), ids=SEGMENTS.keys())
@pytest.mark.parametrize("n", [2, 3, 4])
def test_reduce_gather_scatter_all_to_all(fake_group, n, segment, transport):
    counts = _counts(n, segment)
    for dtype in ("bfloat16", "float32", "int8"):
        got = fake_group(n, segment, transport).run(_rooted_and_all_to_all, dtype, counts)
        assert got == [[]] * n, dtype


@pytest.mark.parametrize("n", [2, 3, 4])
def test_random_float32_within_rounding_bound(fake_group, n):
    assert fake_group(n, 40).run(_random_float32, 100_003, 7) == [True] * n


@pytest.mark.parametrize("n", [2, 3])
def test_async_calls_in_flight(fake_group, n):
    assert fake_group(n, 40).run(_async_calls_in_flight) == [True] * n


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_calls_start_after_the_work_queued_on_the_callers_stream(fake_group, n, transport):
    # 5 elements take the bulletin over shm; the others the staged ring.
    counts = [5, 4099, 100_003, 5, 4099, 100_003]
    assert fake_group(n, 40, transport).run(_after_the_callers_stream, counts) == [[]] * n


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_device_and_host_ranks_in_one_collective(fake_group, transport):
    # 1..20 float32 fit a bulletin entry (80 bytes), 21 does not.
    counts = [1, 2, 20, 21, 1001]
    assert fake_group(3, 40, transport).run(_device_and_host_ranks_meet, counts) == [[]] * 3


@pytest.mark.parametrize("transport", ["tcp", "shm", "shm+tcp"])
def test_device_and_host_ranks_in_every_collective(fake_group, transport):
    # Sizes through the bulletin (1, 20 floats), the latency paths and the ring.
    counts = [1, 20, 1001, 70_001]
    got = fake_group(3, 0, transport).run(_every_collective_mixed, counts, timeout=300)
    assert got == [[]] * 3


def test_same_bytes_on_the_wire_as_the_host_ring(fake_group):
    for host, staged in fake_group(4, 0).run(_bytes_on_the_wire, 1 << 16):
        assert staged == host
        # 2(n-1)/n of the buffer, plus one 40-byte header.
        assert host == 2 * 3 * (1 << 16) * 4 // 4 + 40


def test_device_arrays_take_the_bulletin_as_host_arrays_do(fake_group):
    # On shared memory an all_reduce of at most 80 bytes sends no message at all;
    # a rank with device arrays must do the same as its peers with host arrays.
    for host, staged in fake_group(2, 0, "shm").run(_bytes_on_the_wire, 20):
        assert staged == host == 0


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_on_the_bulletin(fake_group, n):
    # Every dtype and op at counts on both sides of the bulletin's 80 bytes, in place
    # and out of place, staged through the fake device.
    for dtype in DTYPES:
        got = fake_group(n, 0, "shm").run(_all_reduce, dtype, [0, 1, 3, 10, 11, 20, 21])
        assert got == [[]] * n, dtype


def _lands_in_place(comm, count):
    """A ring all_reduce and an all_gather of device arrays: right results; per call,
    the bytes sent and received, and those copied between the device and the
    transport's memory directly; and the page locks this process holds while the
    communicator is open and once it is closed."""
    from ringreduce import _core

    n, r = comm.world_size, comm.rank
    x = np.arange(count, dtype=np.float32) * (r + 1)
    out = np.full(count, -1, np.float32)
    gathered = np.full((n, count), -1, np.float32)
    moved = []
    for call in (
        lambda: comm.all_reduce(fake(x), out=fake(out)),
        lambda: comm.all_gather(fake(x), out=fake(gathered)),
    ):
        before = comm.stats()
        call()
        after = comm.stats()
        moved.append(
            tuple(
                after[key] - before[key]
                for key in ("bytes_sent", "bytes_received", "staged_in_place_bytes")
            )
        )
    right = bool(np.array_equal(out, np.arange(count, dtype=np.float32) * (n * (n + 1) // 2)))
    for k in range(n):
        right = right and bool(np.array_equal(gathered[k], np.arange(count) * (k + 1)))
    locked_open = _core.testing.page_locked_ranges()
    comm.close()
    return right, moved, locked_open, _core.testing.page_locked_ranges()


ON = {"RINGREDUCE_DEVICE_IN_PLACE": "1"}


@pytest.mark.parametrize(
    "transport, env, lands",
    [
        ("shm", ON, True),
        ("tcp", ON, False),
        # A GPU that cannot page-lock the inboxes: every segment through the slots.
        ("shm", {**ON, "RINGREDUCE_TEST_FAKE_PAGE_LOCK": "0"}, False),
        # Off, as by default: the same.
        ("shm", {}, False),
    ],
    ids=["shm", "tcp", "shm-unlockable", "shm-default"],
)
@pytest.mark.parametrize("n", [2, 3])
def test_shared_memory_messages_land_on_the_device_in_place(n, transport, env, lands):
    count = 1 << 16  # 256 KiB of float32: the ring, several segments a step
    env = {**FAKE_DEVICE_ENV, **env}
    outcomes = run_ranks(n, _lands_in_place, count, transport=transport, env=env)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        right, (reduce_moved, gather_moved), locked, gone = value
        assert right
        if lands:
            # The all_gather receives the other ranks' buffers and sends as much.
            assert gather_moved[:2] == ((n - 1) * count * 4,) * 2, value
            # Every byte sent and received went in place (shared memory's call
            # headers travel on the bulletin, not as messages).
            for sent, received, in_place in (reduce_moved, gather_moved):
                assert in_place == sent + received, value
            # This rank's home segment (the inbox it reads), and the segment of
            # its right neighbour mapped here (the inbox it writes): locked once each.
            assert locked == 2, value
        else:
            assert (reduce_moved[2], gather_moved[2], locked) == (0, 0, 0), value
        assert gone == 0, "a page lock outlived its mapping"


def test_bad_arguments_fail_locally(fake_group):
    assert fake_group(2, 0).run(_bad_arguments_then_good_call) == [[], []]


# ---- without the fake: the Python side and the engine's refusal --------------


def test_describe_reads_the_interface():
    a = np.zeros((4, 6), dtype=np.float32)
    d = describe(FakeCudaArray(a, device=3, stream=2))
    assert (d.ptr, d.device, d.shape, d.dtype, d.contiguous) == (
        a.ctypes.data,
        3,
        (4, 6),
        "float32",
        True,
    )
    assert d.stream == 2 and d.nbytes == a.nbytes and not d.readonly and d.host is None
    assert describe(FakeCudaArray(a)).stream == 0  # no stream: legacy default
    assert not describe(FakeCudaArray(a[:, ::2])).contiguous
    assert describe(FakeCudaArray(a[:, :1])).contiguous is False


def test_host_arrays_are_described_as_host_memory():
    for x in (np.ones(3), memoryview(b"abc"), bytearray(b"ab")):
        d = describe(x)
        assert d.device == HOST and d.host is not None and d.ptr == d.host.ctypes.data
    assert describe(FakeCudaArray(np.ones(3))).device == 0


@pytest.mark.skipif(
    cuda_available(),
    reason="a real GPU would be handed host memory: run with CUDA_VISIBLE_DEVICES= to hide it",
)
def test_device_arrays_without_a_usable_device_fail_locally():
    with rr.init("tcp", rank=0, world_size=1) as comm:
        x = FakeCudaArray(np.ones(4, dtype=np.float32))
        with pytest.raises(ValueError, match="CUDA"):
            comm.all_reduce(x, out=x)
        assert comm.all_reduce(np.ones(4, dtype=np.float32))[0] == 1.0
