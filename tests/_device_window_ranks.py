"""Rank functions of the device-window tests: run on the fake device
(tests/test_device_windows.py) and on a GPU (tests/test_cuda.py), the same calls.

On the fake device a window's memory is host memory and is read through its address;
on a GPU it is copied in and out with the extension's cudaMemcpy hook."""

from __future__ import annotations

import ctypes
import os

import numpy as np
from _kernels import half_window_cases

from ringreduce import _core
from ringreduce._comm.core.windows import DeviceWindowArray

from _data import DTYPES, FLOATING, OPS, contribution, expected, np_dtype, same_bits


def on_fake_device() -> bool:
    return os.environ.get("RINGREDUCE_TEST_FAKE_DEVICE") == "1"


def write(a: DeviceWindowArray, values: np.ndarray) -> None:
    """Copies ``values`` to the start of the window."""
    values = np.ascontiguousarray(values)
    if on_fake_device():
        host(a, np.uint8)[: values.nbytes] = values.view(np.uint8).reshape(-1)
    elif values.nbytes:
        _core.testing.cuda_memcpy(a.ptr, values.ctypes.data, values.nbytes)


def read(a: DeviceWindowArray, dtype, count: int) -> np.ndarray:
    """A host copy of the window's first ``count`` elements of ``dtype``."""
    out = np.empty(count, np.dtype(dtype))
    if on_fake_device():
        out[:] = host(a, out.dtype)[:count]
    elif out.nbytes:
        _core.testing.cuda_memcpy(out.ctypes.data, a.ptr, out.nbytes)
    return out


def host(a: DeviceWindowArray, dtype=None) -> np.ndarray:
    """The fake device's memory behind ``a``, as numpy (host memory on the fake device)."""
    assert on_fake_device(), "only the fake device's memory is host memory"
    raw = np.frombuffer((ctypes.c_uint8 * a.nbytes).from_address(a.ptr), np.uint8)
    return raw.view(a.dtype if dtype is None else dtype)


class View:
    """The first ``count`` elements of a device window as ``dt``: what torch.as_tensor
    or cupy would hand the collectives, through the CUDA array interface."""

    def __init__(self, window: DeviceWindowArray, dt, count: int) -> None:
        self.owner = window
        self.dtype = np.dtype(dt)
        self.device = window.device
        self.__cuda_array_interface__ = {
            "shape": (count,),
            "typestr": self.dtype.str,
            "data": (window.ptr, False),
            "strides": None,
            "version": 3,
        }


def counts(n):
    # One element, fewer elements than ranks (empty chunks), odd sizes and a chunk of
    # about a MiB: device windows take the window path at every size.
    return [1, n - 1, 7, 1000 * n + 1, (1 << 18) + 3] if n > 2 else [1, 7, 1001, (1 << 18) + 3]


def exact(comm):
    """Every dtype x op x count, in place and out of place: [(dtype, count, op, in place,
    first wrong index)], the calls made, the calls the window path ran."""
    n, r = comm.world_size, comm.rank
    biggest = max(counts(n)) * 8
    x = comm.empty(biggest, np.uint8, device="cuda")
    y = comm.empty(biggest, np.uint8, device="cuda")
    bad, calls = [], 0
    before = comm.stats()["all_reduce_algorithms"]["window"]
    for dtype in DTYPES:
        dt = np_dtype(dtype)
        for count in counts(n):
            for op in OPS:
                if op == "avg" and dtype not in FLOATING:
                    continue
                want = expected(n, count, dtype, op)
                for in_place in (False, True):
                    write(x, contribution(r, count, dtype, op))
                    write(y, np.zeros(count, dt))
                    src = View(x, dt, count)
                    out = src if in_place else View(y, dt, count)
                    comm.all_reduce(src, op, out=out)
                    calls += 1
                    got = read(x if in_place else y, dt, count)
                    if not same_bits(got, want):
                        first = int(np.flatnonzero(got != want)[0])
                        bad.append((dtype, count, op, in_place, first))
    ran = comm.stats()["all_reduce_algorithms"]["window"] - before
    return bad, calls, ran


def float_order(comm):
    """Random float32: each chunk is summed in rank order, the host window path's bits."""
    n, r = comm.world_size, comm.rank
    count = 100003
    parts = [np.random.default_rng(k).standard_normal(count).astype(np.float32) for k in range(n)]
    x = comm.empty(count, np.float32, device="cuda")
    out = comm.empty(count, np.float32, device="cuda")
    write(x, parts[r])
    comm.all_reduce(x, out=out)
    want = parts[0].copy()
    for p in parts[1:]:
        want = want + p
    got = read(out, np.float32, count)
    return same_bits(got, want), got.tobytes() == comm.all_gather(got).reshape(n, -1)[0].tobytes()


def half_sums(comm):
    """Random float16 and bfloat16 gradients, summed and averaged in place and out of
    place: [(dtype, op, in place, first wrong index)] against float32 accumulation
    rounded once, whether each result is the same bits on every rank, and whether the
    data could tell that from rounding at every hop."""
    n = comm.world_size
    count = 50003
    x = comm.empty(count, np.float32, device="cuda")
    y = comm.empty(count, np.float32, device="cuda")
    bad, same, telling = [], True, []
    for dtype, op, inputs, want, differs in half_window_cases(n, count):
        dt = np_dtype(dtype)
        telling.append(differs)
        for in_place in (False, True):
            write(x, inputs[comm.rank])
            src = View(x, dt, count)
            comm.all_reduce(src, op, out=src if in_place else View(y, dt, count))
            got = read(x if in_place else y, dt, count)
            if not same_bits(got, want):
                bad.append((dtype, op, in_place, int(np.flatnonzero(got != want)[0])))
            same = same and got.tobytes() == comm.all_gather(got).reshape(n, -1)[0].tobytes()
    return bad, same, telling


def reuse_under_pressure(comm, rounds):
    """Back-to-back calls that rewrite their buffers at once: a rank that says `done`
    before its chunk reached every output, or reads an input before its owner's stream
    got there, gives a wrong sum in some round."""
    n, r = comm.world_size, comm.rank
    count = 4099
    x = comm.empty(count, np.int64, device="cuda")
    y = comm.empty(count, np.int64, device="cuda")
    base = np.arange(count, dtype=np.int64)
    for i in range(rounds):
        write(x, base * (r + 1) + i)
        write(y, np.full(count, -1, np.int64))  # overwritten right after the last call
        comm.all_reduce(x, out=y)
        want = base * (n * (n + 1) // 2) + n * i
        got = read(y, np.int64, count)
        if not np.array_equal(got, want):
            return f"round {i}: {int(np.count_nonzero(got != want))} elements wrong"
        if i % 3 == 0:
            comm.all_reduce(x, out=x)  # in place too
            if not np.array_equal(read(x, np.int64, count), want):
                return f"round {i} in place: wrong"
    return "ok"
