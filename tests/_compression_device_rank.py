"""Rank-side functions of tests/test_compression_device.py (module level, so they pickle
by reference): compressed calls of fake device arrays (tests/_fake_cuda.py) against the
same calls of host arrays, with the same call numbers and so the same seeds."""

from __future__ import annotations

import numpy as np
from _compression_rank import CODECS, PythonInt8, _fresh_numbers, contribution
from _fake_cuda import fake, fake_kind

from ringreduce.compression import ErrorFeedback


def _pair(comm, run_host, run_device):
    """(host result, device result): each the first compressed call of its run."""
    _fresh_numbers(comm)
    host = run_host()
    _fresh_numbers(comm)
    device = run_device()
    return host, device


def _host_call(comm, x, op, what, codec, res):
    kw = dict(compression=codec, error_feedback=res)
    if what == "reduce_scatter":
        return comm.reduce_scatter(x, op, **kw)
    if what == "in_place":
        y = x.copy()
        comm.all_reduce(y, op, out=y, **kw)
        return y
    return comm.all_reduce(x, op, **kw)


def _device_call(comm, x, op, what, codec, res, shape):
    kw = dict(compression=codec, error_feedback=None if res is None else fake(res))
    if what == "reduce_scatter":
        out = np.full(shape, 99, x.dtype)
        comm.reduce_scatter(fake(x), op, out=fake(out), **kw)
        return out
    y = x.copy() if what == "in_place" else np.full(shape, 99, x.dtype)
    comm.all_reduce(fake(y) if what == "in_place" else fake(x), op, out=fake(y), **kw)
    return y


def device_matches_host(comm, sizes, dtypes=("float32", "float16", "bfloat16")):
    """Every codec x dtype x size x (all_reduce, reduce_scatter, all_reduce in place) x
    (sum, avg) x (no residual, a residual): whether the device call's result, its
    residual afterwards and its input equal the host call's, byte for byte. A residual
    starts nonzero (what an earlier call left), the same on both sides."""
    got = {}
    for codec in CODECS:
        for dtype in dtypes:
            for n in sizes:
                x = contribution(comm.rank, n, dtype)
                for what in ("all_reduce", "reduce_scatter", "in_place"):
                    for op in ("sum", "avg"):
                        for fed in (False, True):
                            start = contribution(comm.rank + 7, n, "float32", 1e-3)
                            res_h = start.copy() if fed else None
                            res_d = start.copy() if fed else None
                            _fresh_numbers(comm)
                            host = _host_call(comm, x, op, what, codec, res_h)
                            _fresh_numbers(comm)
                            device = _device_call(comm, x, op, what, codec, res_d, host.shape)
                            got[codec, dtype, n, what, op, fed] = (
                                host.tobytes() == device.tobytes(),
                                res_h is None or res_h.tobytes() == res_d.tobytes(),
                                x.tobytes() == contribution(comm.rank, n, dtype).tobytes(),
                            )
    return got


def device_feedback_converges(comm, n, calls):
    """The running mean of ``calls`` int4 all_reduces of the same device array, with a
    device residual and without: (mean with, mean without)."""
    x = contribution(comm.rank, n, "float32")
    means = []
    for fed in (True, False):
        res = np.zeros(n, np.float32)
        total = np.zeros(n)
        for _ in range(calls):
            out = np.empty(n, np.float32)
            ef = fake(res) if fed else None
            comm.all_reduce(fake(x), compression="int4", error_feedback=ef, out=fake(out))
            total += out
        means.append(total / calls)
    return means


def device_other_paths(comm, n):
    """Device calls beside the codec path, each against its host counterpart: auto (exact
    on one host), an exact call that clears a residual (compression=None), an async call
    whose result is allocated like x, and a non-finite block; and that an async device
    call is one engine collective, with no lane."""
    x = contribution(comm.rank, n, "float32")
    got = {}
    host, device = _pair(
        comm,
        lambda: comm.all_reduce(x, compression="auto"),
        lambda: comm.all_reduce(fake(x), compression="auto", out=fake(np.empty(n, np.float32))),
    )
    got["auto"] = host.tobytes() == device.array.tobytes()
    for dtype in ("float32", "bfloat16"):
        xd = contribution(comm.rank, n, dtype)
        start = contribution(comm.rank + 3, n, "float32", 1e-2)
        res_h, res_d = start.copy(), start.copy()
        _fresh_numbers(comm)
        host = comm.all_reduce(xd, compression=None, error_feedback=res_h)
        _fresh_numbers(comm)
        device = np.empty(n, xd.dtype)
        comm.all_reduce(fake(xd), compression=None, error_feedback=fake(res_d), out=fake(device))
        got["exact", dtype] = (
            host.tobytes() == device.tobytes(),
            not res_h.any() and not res_d.any(),
        )
    with fake_kind():
        host, device = _pair(
            comm,
            lambda: comm.all_reduce(x, compression="int8"),
            lambda: comm.all_reduce(fake(x), compression="int8", async_op=True).wait(),
        )
    got["async"] = host.tobytes() == device.array.tobytes()
    # One engine collective, queued like any other: the lane never starts.
    import threading

    ops = comm.stats()["ops"]
    work = comm.all_reduce(
        fake(x), compression="int8", out=fake(np.empty(n, np.float32)), async_op=True
    )
    lane = any(t.name == "ringreduce-lane" for t in threading.enumerate())
    work.wait()
    got["one_collective"] = (comm.stats()["ops"] - ops, lane) == (1, False)
    bad = x.copy()
    bad[3] = np.inf if comm.rank == 0 else 1.0
    bad[700] = np.nan if comm.rank == 1 else 2.0
    host, device = _pair(
        comm,
        lambda: comm.all_reduce(bad, compression="int8"),
        lambda: comm.all_reduce(fake(bad), compression="int8", out=fake(np.empty(n, np.float32))),
    )
    got["non_finite"] = host.tobytes() == device.array.tobytes()
    got["stats"] = comm.stats()["compression"]["int8"]["wire_bytes"] > 0
    return got


def device_refusals(comm):
    """What a compressed call of a device array refuses, before any rank talks: the
    message of each error, by case; then a good call, to show the ranks still agree."""
    x = contribution(comm.rank, 100, "float32")
    cases = {
        "python_codec": dict(compression=PythonInt8(8, "int8-python", 0.1)),
        # No array kind registered for FakeCudaArray here: nowhere to allocate a residual.
        "feedback_beside_unknown_arrays": dict(compression="int8", error_feedback=ErrorFeedback()),
        "host_residual": dict(compression="int8", error_feedback=np.zeros(100, np.float32)),
        "short_residual": dict(compression="int8", error_feedback=fake(np.zeros(99, np.float32))),
        "integers": dict(compression="int8", x=fake(np.arange(100, dtype=np.int32))),
    }
    got = {}
    for name, kw in cases.items():
        arg = kw.pop("x", fake(x))
        try:
            comm.all_reduce(arg, out=fake(np.empty(100, arg.dtype)), **kw)
            got[name] = None
        except (TypeError, ValueError) as e:
            got[name] = f"{type(e).__name__}: {e}"
    out = np.empty(100, np.float32)
    comm.all_reduce(fake(x), compression="int8", out=fake(out))
    return got, out


def device_feedback_objects(comm, n, calls):
    """An ErrorFeedback used by device calls against one used by host calls, each from
    call number 0: (results equal, residuals equal, norms equal, where the residual was
    kept, whether a state saved from the device run and loaded into a fresh
    ErrorFeedback continues as the host run does)."""
    x = contribution(comm.rank, n, "float32")
    with fake_kind():
        runs = []
        for on_device in (False, True):
            _fresh_numbers(comm)
            ef = ErrorFeedback()
            got = []
            for _ in range(calls):
                if on_device:
                    out = np.empty(n, np.float32)
                    comm.all_reduce(
                        fake(x), compression="int4", error_feedback=ef.key("x"), out=fake(out)
                    )
                else:
                    out = comm.all_reduce(x, compression="int4", error_feedback=ef.key("x"))
                got.append(out.tobytes())
            runs.append((got, ef))
        (host, ef_h), (device, ef_d) = runs
        kept = type(ef_d._store["x"]).__name__
        saved, host_saved = ef_d.state_dict(), ef_h.state_dict()
        norms = (ef_h.norm(), ef_d.norm())
        # One more call each: the host run goes on; the device run restarts from its
        # checkpoint (numpy residuals, moved to the device by the call).
        from ringreduce._comm.compressed import route as compressed

        calls_now = compressed._STATES[comm].calls
        more_h = comm.all_reduce(x, compression="int4", error_feedback=ef_h.key("x")).tobytes()
        restored = ErrorFeedback()
        restored.load_state_dict(saved)
        compressed._STATES[comm].calls = calls_now
        out = np.empty(n, np.float32)
        comm.all_reduce(
            fake(x), compression="int4", error_feedback=restored.key("x"), out=fake(out)
        )
        return {
            "results": host == device,
            "residuals": host_saved["residuals"]["x"].tobytes()
            == saved["residuals"]["x"].tobytes(),
            "norm": norms[0] == norms[1] > 0,
            "kept": kept,
            "restored": more_h == out.tobytes(),
            "moved": type(restored._store["x"]).__name__,
        }
