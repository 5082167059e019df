"""all_reduce's fast path (the engine's IssueGate.all_reduce) against the general path.

Every input the fast path takes must give the same bits, and every input it declines
must reach the general path before anything was issued, where the same errors and
refusal reports as before come from. The fast path's taking or declining is observed
by wrapping the communicator's entry into it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ringreduce as rr

_TAKEN = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8"]


class _Spy:
    """Which path each all_reduce took: the gate counts the calls its fast path ran."""

    def __init__(self, comm):
        self.gate = comm._issuer.gate
        self.taken: list = []

    def call(self, fn, *args, **kwargs):
        before = self.gate.fast_calls
        try:
            return fn(*args, **kwargs)
        finally:
            self.taken.append(self.gate.fast_calls == before + 1)


def _data(comm, dtype, shape):
    base = np.arange(int(np.prod(shape)), dtype=np.int64) % 7 + 1 + comm.rank
    return base.reshape(shape).astype(dtype)


def _parity(comm):
    """Every accepted kind through both paths; returns the mismatches (empty: none)."""
    spy = _Spy(comm)
    general_method = type(comm).all_reduce  # the Python method: the general path's entry
    bad = []
    for dtype in _TAKEN:
        ops = ["sum", "prod", "min", "max"] + (["avg"] if np.dtype(dtype).kind == "f" else [])
        for op in ops:
            for shape in [(), (1,), (3,), (2, 3), (40,), (1000,)]:
                x = _data(comm, dtype, shape)
                general = comm.all_reduce(x, op, async_op=True).wait()  # never the fast path
                fast = spy.call(comm.all_reduce, x, op)
                into = np.empty_like(x)
                fast_out = spy.call(comm.all_reduce, x, op=op, out=into)
                inplace = x.copy()
                spy.call(comm.all_reduce, inplace, op, out=inplace)
                method = spy.call(general_method, comm, x, op)
                results = (("new", fast), ("out", fast_out), ("in place", inplace))
                for label, got in results + (("method", method),):
                    if got.dtype != general.dtype or got.shape != general.shape:
                        bad.append((dtype, op, shape, label, "dtype/shape"))
                    elif got.tobytes() != general.tobytes():
                        bad.append((dtype, op, shape, label, "bits"))
                if fast_out is not into:
                    bad.append((dtype, op, shape, "out", "not the out array"))
    if not spy.taken or not all(spy.taken):
        bad.append(("the fast path declined", spy.taken.count(False), "of", len(spy.taken)))
    return bad


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fast_path_gives_the_general_paths_bits(group_factory, n):
    assert group_factory(n, transport="shm").run(_parity) == [[]] * n


def _declined(comm):
    """Inputs the fast path hands back, None before anything was issued: each gets the
    general path's result, or its error."""
    spy = _Spy(comm)
    n = comm.world_size
    x = np.ones(6, np.float32)
    strided_out = np.empty(6, np.float32)[::2]
    cases = {  # name: (x, out, op, what the general path gives)
        "strided": (x[::2], None, "sum", "value"),
        "op enum": (x, None, rr.ReduceOp.SUM, "value"),
        "out non-contiguous": (np.ones(3, np.float32), strided_out, "sum", "error"),
        "out other dtype": (np.ones(3, np.float32), np.empty(3, np.float64), "sum", "error"),
        "list": ([1.0, 2.0], None, "sum", "error"),
        "bool": (np.ones(4, bool), None, "max", "error"),
        "int16": (np.ones(4, np.int16), None, "sum", "error"),
        "big-endian": (np.ones(4, ">f4"), None, "sum", "error"),
        "masked": (np.ma.masked_array(np.ones(3, np.float32)), None, "sum", "error"),
        "out masked": (x, np.ma.masked_array(np.zeros(6, np.float32)), "sum", "error"),
        "matrix": (np.asmatrix(np.ones((1, 3), np.float32)), None, "sum", "value"),
    }
    report = {}
    for name, (a, out, op, _) in cases.items():
        before = len(spy.taken)
        try:
            got = spy.call(comm.all_reduce, a, op, out=out)
            ok = np.array_equal(np.asarray(got, np.float64), np.asarray(a, np.float64) * n)
            outcome = "value" if ok else f"wrong value {got}"
        except (TypeError, ValueError) as exc:
            outcome = "error" if str(exc) else "error without a message"
        report[name] = (spy.taken[before:], outcome)
    return {k: v for k, v in report.items() if v != ([False], cases[k][3])}


def test_declined_inputs_take_the_general_path(group_factory):
    assert group_factory(2, transport="shm").run(_declined) == [{}, {}]


def _overlapping():
    buf = np.ones(8, np.float32)
    return (buf[0:4],), {"out": buf[1:5]}


def _errors(comm):
    """Bad arguments get the general path's errors, whichever path saw them first."""
    x = np.ones(4, np.float32)
    errors = []
    for args, kwargs in [
        ((x, "foo"), {}),
        ((x,), {"out": np.empty(5, np.float32)}),
        _overlapping(),
        ((np.ones(4, np.int32), "avg"), {}),
    ]:
        try:
            comm.all_reduce(*args, **kwargs)
            errors.append("no error")
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__ + ": " + str(exc))
    return errors


def test_errors_are_the_general_paths(group_factory):
    (errors,) = group_factory(1, transport="shm").run(_errors)
    assert errors[0].startswith("ValueError") and "foo" in errors[0], errors[0]
    assert errors[1].startswith("ValueError") and "shape" in errors[1], errors[1]
    assert errors[2].startswith("ValueError") and "overlap" in errors[2], errors[2]
    assert errors[3].startswith(("ValueError", "TypeError")) and "avg" in errors[3], errors[3]


def _refuse_then_fast(comm):
    """Rank 1 refuses an all_reduce (wrong out shape); rank 0's fast-path call is then
    met by rank 1's next call, and names rank 1's refusal."""
    x = np.ones(4, np.float32)
    if comm.rank == 1:
        try:
            comm.all_reduce(x, out=np.empty(5, np.float32))
        except ValueError:
            pass
        try:
            comm.all_reduce(np.ones(7, np.float32))
            return "no error"
        except rr.RingReduceError as exc:
            return type(exc).__name__, exc.peer, str(exc)
    try:
        comm.all_reduce(x)
        return "no error"
    except rr.RingReduceError as exc:
        return type(exc).__name__, exc.peer, str(exc)


def test_a_refusal_is_named_to_a_fast_path_call():
    from _ranks import run_ranks

    outcomes = run_ranks(2, _refuse_then_fast, init_timeout=30, transport="shm")
    for rank, (status, value, tb) in enumerate(outcomes):
        assert status == "ok", tb
        kind, peer, message = value
        assert peer == 1, (rank, message)
        assert "rank 1 refused its call #1, all_reduce: ValueError" in message, (rank, message)


def _two_threads(comm):
    """A second thread's fast-path call while the first is in the gate: the general
    path's ConcurrentUseError, naming both threads, and the communicator refuses."""
    started, release = threading.Event(), threading.Event()
    x = np.ones(2, np.float32)
    comm.all_reduce(x)  # this thread's tag is set: its calls take the fast path
    gate = comm._issuer.gate
    assert gate.try_enter(int(rr._core.Collective.ALL_REDUCE)) == 0  # as a call in progress
    seen = []

    def other():
        started.set()
        try:
            comm.all_reduce(x)
            seen.append("no error")
        except rr.ConcurrentUseError as exc:
            seen.append(str(exc))
        release.set()

    t = threading.Thread(target=other, name="second")
    t.start()
    release.wait(30)
    t.join(30)
    gate.leave()
    try:
        comm.all_reduce(x)
        after = "no error"
    except rr.ConcurrentUseError as exc:
        after = str(exc)
    return seen, after


def test_a_second_thread_is_refused_by_the_gate(group_factory):
    from _ranks import RankGroup

    with RankGroup(1, transport="shm") as group:
        ((seen, after),) = group.run(_two_threads)
    assert len(seen) == 1 and "thread 'second'" in seen[0] and "all_reduce" in seen[0], seen
    assert "refuses every collective" in after, after


def test_the_builtin_has_the_methods_signature_and_frees_the_communicator():
    import gc
    import inspect
    import tempfile
    import weakref

    gc.disable()  # a reference cycle would keep the communicator until a collection
    try:
        comm = rr.init("shm", rank=0, world_size=1, store_dir=tempfile.mkdtemp())
        method = type(comm).all_reduce
        assert comm.all_reduce is not method and comm.all_reduce.__doc__ == method.__doc__
        bound = inspect.signature(comm.all_reduce)
        assert list(bound.parameters) == list(inspect.signature(method).parameters)[1:]
        assert bound.parameters["op"].default == "sum"
        assert comm.all_reduce(np.ones(2, np.float32)).tolist() == [1.0, 1.0]
        ref = weakref.ref(comm)
        comm.close()
        del comm
        assert ref() is None, gc.get_referrers(ref())
    finally:
        gc.enable()


def _auto_kept_exact(comm, sizes):
    """Blocking "auto" calls, of each size and op: (those that took the fast path
    without entering the compressed module's general path, those that entered it,
    mismatches with the exact call's bits, how far the compressed calls' count moved per
    call). Auto keeps exact every call over shared memory on one host, and calls under
    its smallest size elsewhere."""
    from ringreduce._comm.compressed import route as compressed

    spy = _Spy(comm)
    comm.all_reduce(np.ones(4, np.float32), compression="int8")  # the compressed state exists
    st = compressed._state(comm)
    entered = []
    general = compressed.all_reduce

    def watched(*args, **kwargs):
        entered.append(True)
        return general(*args, **kwargs)

    compressed.all_reduce = watched
    taken, through, bad, counted = [], [], [], []
    try:
        for n in sizes:
            for op in ("sum", "avg"):
                x = (np.arange(n, dtype=np.float32) % 13) * 0.25 + comm.rank
                exact = comm.all_reduce(x, op)
                calls, before = st.calls, len(entered)
                got = spy.call(comm.all_reduce, x, op, compression="auto")
                counted.append(st.calls - calls)
                if len(entered) > before:
                    through.append((n, op))
                elif spy.taken[-1]:
                    taken.append((n, op))
                if got.dtype != exact.dtype or got.tobytes() != exact.tobytes():
                    bad.append((n, op))
        # A strided array: the fast path declines it, and the general exact path runs it
        # without counting it a second time.
        x = (np.arange(20, dtype=np.float32) + comm.rank)[::2]
        calls, before = st.calls, len(entered)
        got = spy.call(comm.all_reduce, x, compression="auto")
        counted.append(st.calls - calls)
        if spy.taken[-1] or len(entered) > before:
            bad.append(("strided", spy.taken[-1], len(entered) > before))
        if not np.array_equal(got, comm.all_reduce(x.copy())):
            bad.append(("strided", "bits"))
    finally:
        compressed.all_reduce = general
    return taken, through, bad, counted


def test_auto_calls_kept_exact_take_the_fast_path():
    # Groups of its own: auto's calibration state would outlive the test in a shared one.
    from ringreduce.compression.policy import MIN_BYTES

    from _ranks import RankGroup

    # One host over shared memory: auto never compresses, so every call is exact.
    sizes = (3, 1000, MIN_BYTES // 4 + 1000)
    every = [(n, op) for n in sizes for op in ("sum", "avg")]
    with RankGroup(2, transport="shm") as group:
        results = group.run(_auto_kept_exact, sizes)
    for taken, through, bad, counted in results:
        assert (taken, through, bad) == (every, [], []), (taken, through, bad)
        assert counted == [1] * (len(every) + 1), counted  # numbered like any compressed call
    # Over TCP, calls under auto's smallest size are kept exact; from it up, auto decides
    # on the compressed module's path (its first calls there calibrate).
    sizes = (3, 1000, MIN_BYTES // 4 - 1, MIN_BYTES // 4 + 1000)
    small = [(n, op) for n in sizes[:3] for op in ("sum", "avg")]
    big = [(sizes[3], op) for op in ("sum", "avg")]
    with RankGroup(2, transport="tcp") as group:
        results = group.run(_auto_kept_exact, sizes)
    for taken, through, bad, counted in results:
        assert (taken, through, bad) == (small, big, []), (taken, through, bad)
        assert counted[: len(small)] == [1] * len(small) and counted[-1] == 1, counted
