"""No silent wrong data: every way an array can be laid out or shared, on every input
path. Each case either gives numpy's answer or raises a ValueError/TypeError naming what
was wrong, on the calling rank, before any communication (the next call still works).

Expected values come from rank and size alone (small integers, exact in every dtype).
"""

from __future__ import annotations

import numpy as np
import pytest

import ringreduce as rr

from _data import expect_errors

SIZES = [2, 3]


def _base(r: int, n: int = 24, dtype=np.float64) -> np.ndarray:
    """Rank r's data: distinct small integers."""
    return (np.arange(n) % 11 + 3 * r).astype(dtype)


def _sum_of(n: int, make) -> np.ndarray:
    """The elementwise sum over ranks of make(rank)."""
    return sum(np.asarray(make(i), dtype=np.float64) for i in range(n))


class _Checks:
    """Collects every mismatch, so one run reports them all."""

    def __init__(self) -> None:
        self.errors: list = []

    def same(self, name: str, got, want) -> None:
        got = np.asarray(got)
        want = np.asarray(want)
        if got.shape != want.shape or not np.array_equal(got.astype(np.float64), want):
            self.errors.append(
                f"{name}: got {got.ravel()[:8]} {got.shape}, want {want.ravel()[:8]} {want.shape}"
            )

    def true(self, name: str, ok) -> None:
        if not ok:
            self.errors.append(name)


def _communicator_still_works(comm, checks: _Checks) -> None:
    n = comm.world_size
    checks.same("next call", comm.all_reduce(np.full(3, comm.rank + 1.0)), [n * (n + 1) / 2] * 3)


# ---- negative strides and other non-contiguous views ----------------------------------


def _strided_inputs(comm):
    n, r = comm.world_size, comm.rank
    c = _Checks()
    views = {
        "reversed": lambda a: a[::-1],
        "every other, reversed": lambda a: a[::-2],
        "2-D, reversed rows": lambda a: a.reshape(4, 6)[::-1],
        "2-D, both axes strided": lambda a: a.reshape(4, 6)[::2, ::-3],
        "Fortran order": lambda a: np.asfortranarray(a.reshape(4, 6)),
        "transposed": lambda a: a.reshape(4, 6).T,
    }
    for name, view in views.items():
        x = view(_base(r))
        want = _sum_of(n, lambda i, view=view: view(_base(i)))
        c.same(f"all_reduce {name}", comm.all_reduce(x), want)
        c.same(f"all_reduce avg {name}", comm.all_reduce(x, op="avg"), want / n)
        flat = want.ravel()  # reduce_scatter takes x's elements in C order
        start, stop = rr.chunk_bounds(flat.size, n, r)
        c.same(f"reduce_scatter {name}", comm.reduce_scatter(x), flat[start:stop])
        c.same(f"all_gather {name}", comm.all_gather(x), [view(_base(i)) for i in range(n)])
        got = comm.reduce(x, root=n - 1)
        if r == n - 1:
            c.same(f"reduce {name}", got, want)
        got = comm.gather(x, root=0)
        if r == 0:
            c.same(f"gather {name}", got, [view(_base(i)) for i in range(n)])
        c.same(f"x untouched by {name}", x, view(_base(r)))
    # Root's blocks from a strided array, each rank's block into a strided out.
    blocks = np.arange(n * 12, dtype=np.int64).reshape(n * 2, 6)[::-2]
    out = np.zeros(12, dtype=np.int64)[::-2]
    try:
        comm.scatter(blocks.reshape(n, 6) if r == 0 else None, root=0, out=out)
        c.true("scatter into a strided out: no error", False)
    except ValueError as exc:
        c.true(f"scatter out error names it: {exc}", "C-contiguous" in str(exc))
    got = comm.scatter(
        blocks.reshape(n, 6) if r == 0 else None,
        root=0,
        out=None if r == 0 else np.zeros(6, dtype=np.int64),
    )
    c.same("scatter from a strided array", got, blocks.reshape(n, 6)[r])
    rows = np.arange(n * 4, dtype=np.float32).reshape(n * 2, 2)[::-1] + 100 * r
    want = np.concatenate(
        [
            (np.arange(n * 4, dtype=np.float32).reshape(n * 2, 2)[::-1] + 100 * i)[
                2 * r : 2 * r + 2
            ]
            for i in range(n)
        ]
    )
    c.same("all_to_all reversed rows", comm.all_to_all(rows), want)
    _communicator_still_works(comm, c)
    return c.errors


def _broadcast_into_views(comm):
    """broadcast writes root's values into exactly the view's elements, nothing else."""
    n, r = comm.world_size, comm.rank
    c = _Checks()
    for name, view in {
        "reversed": lambda a: a[::-1],
        "strided 2-D": lambda a: a.reshape(4, 6)[1::2, ::-2],
        "Fortran order": lambda a: a.reshape(6, 4).T,
        "0-d": lambda a: a[5, ...],
        "empty": lambda a: a[3:3],
    }.items():
        for root in range(n):
            memory = _base(r) + 100
            x = view(memory)
            comm.broadcast(x, root=root)
            want_memory = _base(r) + 100
            view(want_memory)[...] = view(_base(root) + 100)
            c.same(f"broadcast into {name} from {root}", memory, want_memory)
            w = comm.broadcast(view(_base(r) + 200), root=root, async_op=True)
            c.same(f"async broadcast into {name} from {root}", w.wait(), view(_base(root) + 200))
    _communicator_still_works(comm, c)
    return c.errors


# ---- in and out sharing memory ---------------------------------------------------------


def _aliased_in_and_out(comm):
    n, r = comm.world_size, comm.rank
    c = _Checks()
    m = 5
    sum_all = _sum_of(n, lambda i: _base(i, n * m))
    # all_reduce: in place is fine; x a view of out's memory in another order is fine.
    x = _base(r, n * m)
    comm.all_reduce(x, out=x)
    c.same("all_reduce out=x", x, sum_all)
    x = _base(r, n * m)
    comm.all_reduce(x, out=x.view(), async_op=True).wait()
    c.same("all_reduce out=x.view() async", x, sum_all)
    memory = _base(r, n * m)[::-1].copy()
    comm.all_reduce(memory[::-1], out=memory)  # x is out reversed
    c.same("all_reduce x=out[::-1]", memory, sum_all)
    # reduce_scatter: out is this rank's block of x (in place), or any other overlap.
    start, stop = rr.chunk_bounds(n * m, n, r)
    for name, where in {
        "own block": start,
        "front": 0,
        "one element in": 1,
        "last block": n * m - (stop - start),
    }.items():
        x = _base(r, n * m)
        out = x[where : where + stop - start]
        got = comm.reduce_scatter(x, out=out)
        c.true(f"reduce_scatter returns out ({name})", got is out)
        c.same(f"reduce_scatter out in x at {name}", out, sum_all[start:stop])
    # all_gather: x is out's own row (in place), another row, or straddles two rows.
    rows = [_base(i, m) for i in range(n)]
    for name, place in {"own row": r * m, "row 0": 0, "straddling": m // 2 + 1}.items():
        out = np.zeros((n, m))
        flat = out.reshape(-1)
        flat[place : place + m] = rows[r]
        comm.all_gather(flat[place : place + m], out=out)
        c.same(f"all_gather x in out at {name}", out, rows)
    # gather and scatter on root, all_to_all in place.
    for root in range(n):
        out = np.zeros((n, m))
        out[(root + 1) % n] = rows[r]
        got = comm.gather(
            out[(root + 1) % n] if r == root else rows[r], root=root, out=out if r == root else None
        )
        if r == root:
            c.same(f"gather x=out[{(root + 1) % n}] on root {root}", out, rows)
        blocks = np.array(rows) + 50
        out = blocks[(root + 1) % n] if r == root else np.zeros(m)
        comm.scatter(blocks if r == root else None, root=root, out=out)
        c.same(f"scatter out=x[{(root + 1) % n}] on root {root}", out, rows[r] + 50)
    x = np.arange(n * 3, dtype=np.float64) + 100 * r
    comm.all_to_all(x, out=x)
    c.same(
        "all_to_all out=x",
        x,
        np.concatenate([np.arange(3 * r, 3 * r + 3) + 100 * i for i in range(n)]),
    )
    # reduce on root: in place is fine.
    x = _base(r, n * m)
    comm.reduce(x, root=0, out=x if r == 0 else None)
    c.same("reduce out=x on root", x, sum_all if r == 0 else _base(r, n * m))
    # Partial overlap of out and x where the result would be garbage: refused.
    big = _base(r, 2 * m)
    c.errors += expect_errors(
        [
            (lambda: comm.all_reduce(big[:m], out=big[1 : m + 1]), ValueError),
            (lambda: comm.reduce(big[:m], root=r, out=big[1 : m + 1]), ValueError),
        ]
    )
    _communicator_still_works(comm, c)
    return c.errors


# ---- torch: storage offsets and views ------------------------------------------------


def _torch_views(comm):
    import torch

    n, r = comm.world_size, comm.rank
    c = _Checks()

    def base(i: int) -> torch.Tensor:
        return torch.from_numpy(_base(i, 20))

    want = _sum_of(n, lambda i: _base(i, 20))
    # In place on a slice with a storage offset: only the slice changes.
    t = base(r)
    comm.all_reduce(t[3:13], out=t[3:13])
    expect = _base(r, 20)
    expect[3:13] = want[3:13]
    c.same("all_reduce in place on t[3:13]", t.numpy(), expect)
    # Into a slice of another tensor, from a transposed view, from a stride-0 expand.
    out = torch.zeros(30, dtype=torch.float64)
    got = comm.all_reduce(base(r)[2:12], out=out[7:17])
    c.true("all_reduce returns the out view", got.data_ptr() == out[7:17].data_ptr())
    c.same("all_reduce into out[7:17]", out[7:17].numpy(), want[2:12])
    c.same("zeros around out[7:17]", torch.cat([out[:7], out[17:]]).numpy(), np.zeros(20))
    c.same("all_reduce of t.T", comm.all_reduce(base(r).view(4, 5).T).numpy(), want.reshape(4, 5).T)
    c.same(
        "all_reduce of expand",
        comm.all_reduce(base(r)[:5].expand(3, 5)).numpy(),
        np.broadcast_to(want[:5], (3, 5)),
    )
    c.same(
        "all_reduce of unsqueeze+narrow",
        comm.all_reduce(base(r).view(4, 5).narrow(1, 1, 3).unsqueeze(0)).numpy(),
        want.reshape(4, 5)[None, :, 1:4],
    )
    # A lazily negated view: its memory holds the un-negated values.
    c.same("all_reduce of a neg view", comm.all_reduce(torch._neg_view(base(r))).numpy(), -want)
    # broadcast into views with offsets and strides: the gaps stay as they were.
    t = base(r) + 100
    comm.broadcast(t[2::3], root=n - 1)
    expect = _base(r, 20) + 100
    expect[2::3] = (_base(n - 1, 20) + 100)[2::3]
    c.same("broadcast into t[2::3]", t.numpy(), expect)
    # all_gather in place (x is out's row of this rank), reduce_scatter in place.
    out = torch.zeros(n, 4, dtype=torch.float64)
    out[r] = base(r)[:4]
    comm.all_gather(out[r], out=out)
    c.same("all_gather x=out[rank]", out.numpy(), [_base(i, 4) for i in range(n)])
    t = base(r)
    start, stop = rr.chunk_bounds(20, n, r)
    comm.reduce_scatter(t, out=t[start:stop])
    c.same("reduce_scatter out=own block", t[start:stop].numpy(), want[start:stop])
    # Views that cannot be written: refused where the call writes.
    t = base(r)
    c.errors += expect_errors(
        [
            (lambda: comm.all_reduce(t[:10], out=t[2:12]), ValueError),
            (lambda: comm.all_reduce(t, out=torch._neg_view(t)), ValueError),
            (lambda: comm.all_reduce(t, out=t.view(4, 5).T), ValueError),
            (lambda: comm.all_reduce(t, out=t[:5].expand(4, 5)), ValueError),
            (lambda: comm.all_reduce(t.to(torch.float8_e4m3fn)), TypeError),
            (lambda: comm.all_reduce(t.to_sparse()), TypeError),
            (lambda: comm.all_reduce(t.to(torch.uint16)), TypeError),
            (lambda: comm.all_reduce(t > 3), TypeError),
            (lambda: comm.all_gather(t.to(torch.complex64)), TypeError),
            (
                lambda: comm.broadcast(torch.quantize_per_tensor(t.float(), 0.5, 0, torch.qint8)),
                TypeError,
            ),
        ]
    )
    _communicator_still_works(comm, c)
    return c.errors


# ---- read-only arrays ----------------------------------------------------------------


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _read_only(comm):
    n, r = comm.world_size, comm.rank
    c = _Checks()
    x = _readonly(_base(r))
    # Read-only inputs are fine where nothing writes into them.
    c.same("all_reduce of a read-only x", comm.all_reduce(x), _sum_of(n, _base))
    c.same("all_gather of a read-only x", comm.all_gather(x), [_base(i) for i in range(n)])
    got = comm.broadcast(_readonly(_base(r)) if r == 0 else _base(r), root=0)
    c.same("broadcast from a read-only x on root", got, _base(0))
    # In-place calls into read-only memory: refused on the rank that passed it.
    c.errors += expect_errors(
        [
            (lambda: comm.all_reduce(x, out=x), ValueError),
            (lambda: comm.all_reduce(x, out=x, async_op=True), ValueError),
            (lambda: comm.reduce(x, root=r, out=x), ValueError),
            (lambda: comm.all_gather(x, out=_readonly(np.zeros((n, 24)))), ValueError),
            (lambda: comm.reduce_scatter(x, out=_readonly(np.zeros(24))[:1]), ValueError),
            (lambda: comm.all_reduce(np.float64(2.0), out=np.float64(1.0)), ValueError),
            (lambda: comm.recv(_readonly(np.zeros(3)), src=(r + 1) % n), ValueError),
        ]
    )
    # broadcast into read-only memory: refused on every rank but root, which does not
    # write; root then runs a good broadcast with the others.
    for root in range(n):
        if r != root:
            for target in (x, _readonly(_base(r))[::-1], b"\x00" * 8, np.float64(0.0)):
                try:
                    comm.broadcast(target, root=root)
                    c.true(f"broadcast into {type(target).__name__}: no error", False)
                except ValueError as exc:
                    c.true(f"read-only not named: {exc}", "read-only" in str(exc))
        c.same("broadcast after refusals", comm.broadcast(_base(r), root=root), _base(root))
    # scatter into a read-only out, on the ranks that are not root.
    if r != 0:
        c.errors += expect_errors(
            [
                (lambda: comm.scatter(None, root=0, out=_readonly(np.zeros(4))), ValueError),
            ]
        )
    _communicator_still_works(comm, c)
    return c.errors


# ---- 0-d, empty, unsupported ----------------------------------------------------------


def _zero_d_and_empty(comm):
    n, r = comm.world_size, comm.rank
    c = _Checks()
    ranks = np.arange(n, dtype=np.float64)
    x = np.array(r + 1.0)
    c.same("all_reduce 0-d", comm.all_reduce(x), ranks.sum() + n)
    comm.all_reduce(x, out=x)
    c.same("all_reduce 0-d in place", x, ranks.sum() + n)
    c.same("all_reduce numpy scalar", comm.all_reduce(np.float32(r)), ranks.sum())
    c.same("all_gather 0-d", comm.all_gather(np.array(r, dtype=np.int32)), ranks)
    c.same(
        "reduce_scatter 0-d",
        comm.reduce_scatter(np.array(r + 1.0)),
        [ranks.sum() + n] if r == 0 else np.zeros(0),
    )
    c.same("broadcast 0-d", comm.broadcast(np.array(float(r)), root=n - 1), n - 1.0)
    got = comm.gather(np.array(r), root=0)
    if r == 0:
        c.same("gather 0-d", got, ranks)
    got = comm.reduce(np.array(r), root=0)
    if r == 0:
        c.same("reduce 0-d", got, ranks.sum())
    c.same(
        "scatter into 0-d",
        comm.scatter(
            np.arange(n) * 2 if r == 0 else None, root=0, out=None if r == 0 else np.array(0)
        ),
        2 * r,
    )
    for shape in [(0,), (3, 0), (0, 4)]:
        e = np.zeros(shape, dtype=np.float32)
        c.same(f"all_reduce {shape}", comm.all_reduce(e), e)
        c.same(f"all_reduce {shape} in place", comm.all_reduce(e, out=e), e)
        c.same(f"all_gather {shape}", comm.all_gather(e), np.zeros((n, *shape)))
        c.same(f"reduce_scatter {shape}", comm.reduce_scatter(e), np.zeros(0))
        c.same(f"broadcast {shape}", comm.broadcast(e, root=0), e)
        c.same(f"all_reduce {shape} async", comm.all_reduce(e, async_op=True).wait(), e)
    c.same("all_to_all empty", comm.all_to_all(np.zeros((0, 2))), np.zeros((0, 2)))
    c.errors += expect_errors(
        [
            (lambda: comm.all_to_all(np.array(1.0)), ValueError),
            (lambda: comm.scatter(np.array(1.0), root=r, out=None), ValueError),
        ]
    )
    _communicator_still_works(comm, c)
    return c.errors


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    """n copies of a, stacked, in a's own dtype (np.stack may convert the byte order)."""
    rows = np.empty((n, *a.shape), dtype=a.dtype)
    rows[...] = a
    return rows


def _unsupported(comm):
    n, r = comm.world_size, comm.rank
    c = _Checks()
    x = _base(r)
    bad = {
        "bool": np.ones(3, dtype=bool),
        "object": np.array([1, "a"], dtype=object),
        "str": np.array(["ab"]),
        "structured": np.zeros(3, dtype=[("a", "f4")]),
        "datetime": np.zeros(3, dtype="M8[s]"),
        "complex": np.ones(3, dtype=np.complex64),
        "int16": np.ones(3, dtype=np.int16),
        "longdouble": np.ones(3, dtype=np.longdouble),
        "big-endian": np.ones(3, dtype=">i4"),
    }
    for name, a in bad.items():
        for call in (
            lambda a=a: comm.all_reduce(a),
            lambda a=a: comm.all_reduce(a, async_op=True),
            lambda a=a: comm.reduce_scatter(a),
            lambda a=a: comm.all_gather(a),
            lambda a=a: comm.broadcast(a, root=0),
            lambda a=a: comm.reduce(a, root=0),
            lambda a=a: comm.gather(a, root=0),
            lambda a=a: comm.all_to_all(_rows(a, n)),
            lambda a=a: comm.send(a, (r + 1) % n),
        ):
            try:
                call()
                c.true(f"{name}: no error", False)
            except TypeError as exc:
                # Says what was wrong with which argument.
                want = "byte order" if name == "big-endian" else "unsupported dtype"
                c.true(f"{name}: {exc}", str(exc).startswith("x: ") and want in str(exc))
    masked = np.ma.masked_array(x, mask=x > 5)
    for out in bad.values():
        try:
            comm.all_reduce(x, out=out)
            c.true("unsupported out: no error", False)
        except TypeError as exc:
            c.true(f"out not named: {exc}", str(exc).startswith("out: "))
    c.errors += expect_errors(
        [
            (lambda: comm.all_reduce(masked), TypeError),
            (lambda: comm.all_gather(masked), TypeError),
            (lambda: comm.all_reduce(x, out=np.ma.masked_array(np.zeros(24))), TypeError),
            (lambda: comm.all_reduce([1.0, 2.0]), TypeError),
            (lambda: comm.all_reduce(3.0), TypeError),
        ]
    )
    _communicator_still_works(comm, c)
    return c.errors


def _unaligned(comm):
    """float32 at an odd address (memory from a byte buffer) reduces like any other."""
    n, r = comm.world_size, comm.rank
    c = _Checks()
    raw = bytearray(4 * 100 + 1)
    x = np.frombuffer(raw, dtype=np.float32, offset=1, count=100)
    x[:] = np.arange(100) % 7 + r
    want = _sum_of(n, lambda i: np.arange(100) % 7 + i)
    c.same("all_reduce unaligned", comm.all_reduce(x), want)
    comm.all_reduce(x, out=x)
    c.same("all_reduce unaligned in place", x, want)
    c.same("all_gather unaligned", comm.all_gather(x[:10]), [want[:10]] * n)
    _communicator_still_works(comm, c)
    return c.errors


CASES = [
    _strided_inputs,
    _broadcast_into_views,
    _aliased_in_and_out,
    _read_only,
    _zero_d_and_empty,
    _unsupported,
    _unaligned,
]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__.strip("_"))
def test_input_gives_numpys_answer_or_a_named_error(group_factory, n, case):
    assert group_factory(n).run(case) == [[]] * n


@pytest.mark.torch
@pytest.mark.parametrize("n", SIZES)
def test_torch_storage_offsets_and_views(group_factory, n):
    pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    assert group_factory(n).run(_torch_views) == [[]] * n
