"""The torch backend's direct route and window tensors.

Dense, contiguous tensors of the engine's dtypes go straight to the engine, blocking and
async, for every collective DDP and FSDP2 use; other tensors take the general path, and
a rank on one path meets a rank on the other. ``ringreduce.torch.empty`` gives tensors
in windows: ``dist.all_reduce`` on them takes the window path; a window tensor on some
ranks and plain memory on others is a MismatchError naming that path; a destroyed
group's communicator and windows are refused with an error, never a crash.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)
import torch.distributed as dist  # noqa: E402
from _torch_ranks import run  # noqa: E402

import ringreduce as rr  # noqa: E402

_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]


def _fast_calls() -> int:
    import ringreduce.torch as rrt

    return int(rrt.communicator()._issuer.gate.fast_calls)


def _values(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers, exact in every dtype, different on every rank and along the array."""
    return ((torch.arange(count) + rank) % 5 + rank).to(dtype)


def _direct_calls(rank, n):
    """Every collective the direct route takes, blocking and async; the results, and how
    many calls the direct route ran."""
    before = _fast_calls()
    out = {}
    calls = 0
    for name in _DTYPES:
        dtype = getattr(torch, name)
        for async_op in (False, True):
            t = _values(rank, 33, dtype)
            work = dist.all_reduce(t, async_op=async_op)
            if async_op:
                work.wait()
            out[f"all_reduce_{name}_{async_op}"] = t.double()
            calls += 1
    x = _values(rank, 12, torch.float32)
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["all_reduce_avg"] = t.double()
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.double()
    gathered = torch.empty(n * 12)
    dist.all_gather_into_tensor(gathered, x)
    out["all_gather_into_tensor"] = gathered.double()
    gathered = torch.empty(n * 12)
    dist.all_gather_into_tensor(gathered, x, async_op=True).wait()
    out["all_gather_into_tensor_async"] = gathered.double()
    block = torch.empty(3)
    dist.reduce_scatter_tensor(block, _values(rank, 3 * n, torch.float32))
    out["reduce_scatter_tensor"] = block.double()
    block = torch.empty(3)
    dist.reduce_scatter_tensor(block, _values(rank, 3 * n, torch.float32), async_op=True).wait()
    out["reduce_scatter_tensor_async"] = block.double()
    b = x.clone()
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b.double()
    flags = torch.tensor([rank == 0, True, False])
    dist.broadcast(flags, src=0)  # bool: moved as its bytes
    out["broadcast_bool"] = flags.double()
    r = x.clone()
    dist.reduce(r, dst=0)
    out["reduce"] = r.double() if rank == 0 else x.double()
    a2a = torch.empty(2 * n)
    dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float32) + 100 * rank)
    out["all_to_all_single"] = a2a.double()
    dist.barrier()
    calls += 11
    out["direct_calls"] = _fast_calls() - before
    out["expected_calls"] = calls
    return out


def _general_calls(rank, n):
    """The same calls on tensors the direct route leaves to the general path
    (non-contiguous views): the results must be the same."""
    out = {}
    for name in _DTYPES:
        dtype = getattr(torch, name)
        for async_op in (False, True):
            wide = torch.stack([_values(rank, 33, dtype), _values(rank, 33, dtype)], dim=1)
            t = wide[:, 0]  # every other element: not contiguous
            work = dist.all_reduce(t, async_op=async_op)
            if async_op:
                work.wait()
            out[f"all_reduce_{name}_{async_op}"] = t.double()
    return out


def _mixed_paths(rank, n):
    """Rank 0 on the general path (non-contiguous tensors), the others on the direct one:
    they meet, since both issue the same engine call."""

    def tensor(values: torch.Tensor) -> torch.Tensor:
        if rank != 0:
            return values.clone()
        return torch.stack([values, values], dim=1)[:, 0]

    out = {}
    t = tensor(_values(rank, 40, torch.float32))
    dist.all_reduce(t)
    out["all_reduce"] = t.double()
    t = tensor(_values(rank, 40, torch.float32))
    dist.broadcast(t, src=1)
    out["broadcast"] = t.double()
    flat = torch.empty(n * 40)
    dist.all_gather_into_tensor(flat, tensor(_values(rank, 40, torch.float32)))
    out["all_gather_into_tensor"] = flat.double()
    block = torch.empty(5)
    dist.reduce_scatter_tensor(block, tensor(_values(rank, 5 * n, torch.float32)))
    out["reduce_scatter_tensor"] = block.double()
    return out


@pytest.mark.torch
def test_direct_route_takes_every_collective_and_gives_the_exact_results():
    n = 2
    direct = run(n, _direct_calls)
    general = run(n, _general_calls)
    for rank in range(n):
        got, other = direct[rank], general[rank]
        # Every call above went the direct way (blocking and async alike).
        assert got["direct_calls"] == got["expected_calls"], got["direct_calls"]
        for name in _DTYPES:
            expected = sum(_values(r, 33, getattr(torch, name)).double() for r in range(n))
            if name in ("int8", "uint8"):  # sums wrap modulo 256, as the dtype does
                expected = expected.to(getattr(torch, name)).double()
            for async_op in (False, True):
                key = f"all_reduce_{name}_{async_op}"
                np.testing.assert_array_equal(got[key], expected.numpy(), err_msg=key)
                # The general path's result, bit for bit.
                np.testing.assert_array_equal(got[key], other[key], err_msg=key)
        x = [_values(r, 12, torch.float32).double() for r in range(n)]
        np.testing.assert_array_equal(got["all_reduce_avg"], (sum(x) / n).float().double())
        np.testing.assert_array_equal(got["all_reduce_max"], torch.stack(x).max(0).values)
        for key in ("all_gather_into_tensor", "all_gather_into_tensor_async"):
            np.testing.assert_array_equal(got[key], torch.cat(x).numpy(), err_msg=key)
        whole = sum(_values(r, 3 * n, torch.float32).double() for r in range(n))
        for key in ("reduce_scatter_tensor", "reduce_scatter_tensor_async"):
            np.testing.assert_array_equal(got[key], whole[3 * rank : 3 * rank + 3], err_msg=key)
        np.testing.assert_array_equal(got["broadcast"], x[n - 1])
        np.testing.assert_array_equal(got["broadcast_bool"], [1.0, 1.0, 0.0])
        np.testing.assert_array_equal(got["reduce"], sum(x) if rank == 0 else x[rank])
        sent = [torch.arange(2 * n, dtype=torch.float64) + 100 * r for r in range(n)]
        received = torch.cat([sent[r][2 * rank : 2 * rank + 2] for r in range(n)])
        np.testing.assert_array_equal(got["all_to_all_single"], received)


@pytest.mark.torch
def test_a_rank_on_the_general_path_meets_ranks_on_the_direct_one():
    n = 3
    results = run(n, _mixed_paths)
    x = [_values(r, 40, torch.float32).double() for r in range(n)]
    whole = sum(_values(r, 5 * n, torch.float32).double() for r in range(n))
    for rank, got in enumerate(results):
        np.testing.assert_array_equal(got["all_reduce"], sum(x))
        np.testing.assert_array_equal(got["broadcast"], x[1])
        np.testing.assert_array_equal(got["all_gather_into_tensor"], torch.cat(x))
        np.testing.assert_array_equal(got["reduce_scatter_tensor"], whole[5 * rank : 5 * rank + 5])


# ---- window tensors ---------------------------------------------------------------------


def _window_all_reduce(rank, n):
    import ringreduce.torch as rrt

    comm = rrt.communicator()
    assert comm is rrt.communicator(dist.group.WORLD)
    out = {}
    before = comm.stats()["all_reduce_algorithms"].get("window", 0)
    for name, shape in (("float32", (256, 64)), ("bfloat16", (3, 4000)), ("int64", (5000,))):
        dtype = getattr(torch, name)
        w = rrt.empty(*shape, dtype=dtype)
        assert w.shape == shape and w.dtype == dtype and bool((w == 0).all())
        w.copy_(_values(rank, w.numel(), dtype).reshape(shape))
        dist.all_reduce(w)
        out[name] = w.double().reshape(-1)
        w2 = rrt.empty(shape, dtype=dtype)  # one sequence as the size, as torch.empty takes
        w2.copy_(_values(rank, w2.numel(), dtype).reshape(shape))
        dist.all_reduce(w2, async_op=True).wait()
        out[name + "_async"] = w2.double().reshape(-1)
    out["windows"] = comm.stats()["all_reduce_algorithms"].get("window", 0) - before
    return out


def _window_on_one_rank_only(rank, n):
    import ringreduce.torch as rrt

    w = rrt.empty(1 << 14)
    plain = torch.ones(1 << 14)
    try:
        dist.all_reduce(w if rank == 0 else plain)
    except rr.MismatchError as exc:
        return "MismatchError", str(exc)
    except Exception as exc:  # noqa: BLE001 - the kind is the assertion
        return type(exc).__name__, str(exc)
    return "no error", ""


def _after_destroy(rank, n):
    import ringreduce.torch as rrt

    group = dist.new_group(backend="ringreduce")
    w = rrt.empty(1000, group=group)
    w.fill_(rank + 1)
    dist.all_reduce(w, group=group)
    total = float(w[0])
    dist.destroy_process_group(group)
    said = {}
    for what, call in (
        ("communicator", lambda: rrt.communicator(group)),
        ("empty", lambda: rrt.empty(10, group=group)),
        ("all_reduce", lambda: dist.all_reduce(w, group=group)),
    ):
        try:
            call()
            said[what] = "no error"
        except Exception as exc:  # noqa: BLE001 - the kind is the assertion
            said[what] = f"{type(exc).__name__}: {exc}"
    w.add_(1)  # the memory is still the tensor's: no crash, plain memory now
    said["after"] = float(w.sum())
    dist.all_reduce(w)  # on the default group: not its window, the usual path
    said["default_group"] = float(w[0])
    try:
        rrt.communicator(dist.new_group(backend="gloo"))
        said["gloo"] = "no error"
    except TypeError as exc:
        said["gloo"] = str(exc)
    return total, said


@pytest.mark.torch
def test_window_tensors_take_the_window_path():
    n = 2
    for got in run(n, _window_all_reduce):
        assert got["windows"] == 6, got["windows"]  # 3 dtypes, blocking and async
        for name, count in (("float32", 256 * 64), ("bfloat16", 12000), ("int64", 5000)):
            dtype = getattr(torch, name)
            expected = sum(_values(r, count, dtype).double() for r in range(n))
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
            np.testing.assert_array_equal(got[name + "_async"], expected, err_msg=name)


@pytest.mark.torch
def test_window_tensor_on_one_rank_only_is_a_mismatch_naming_the_window_path():
    for kind, text in run(2, _window_on_one_rank_only):
        assert kind == "MismatchError", text
        assert "window" in text, text


@pytest.mark.torch
def test_destroyed_group_is_refused_clearly():
    n = 2
    for total, said in run(n, _after_destroy):
        assert total == sum(range(1, n + 1))
        assert (
            said["communicator"].startswith("RingReduceError")
            and "destroyed" in said["communicator"]
        ), said
        assert said["empty"].startswith("RingReduceError") and "destroyed" in said["empty"], said
        assert said["all_reduce"] != "no error", said  # torch refuses a destroyed group
        assert said["after"] == 1000 * (total + 1)
        assert said["default_group"] == n * (total + 1)
        assert "gloo" in said["gloo"] and "ringreduce" in said["gloo"], said


def _empty_refuses(rank, n):
    import ringreduce.torch as rrt

    said = []
    for call in (
        lambda: rrt.empty(-1),
        lambda: rrt.empty(2.5),
        lambda: rrt.empty(3, dtype="float32"),
        lambda: rrt.empty(3, device="meta"),
        lambda: rrt.empty(3, device="cuda"),
    ):
        try:
            call()
            said.append("no error")
        except (TypeError, ValueError) as exc:
            said.append(f"{type(exc).__name__}: {exc}")
    return said


@pytest.mark.torch
def test_empty_refuses_bad_arguments_before_any_collective():
    for said in run(2, _empty_refuses):
        assert said[0].startswith("ValueError") and "non-negative" in said[0], said
        assert said[1].startswith("ValueError"), said
        assert said[2].startswith("TypeError") and "torch.dtype" in said[2], said
        assert said[3].startswith("TypeError") and "device" in said[3], said
        if not torch.cuda.is_available():  # a GPU host makes the window instead
            assert said[4].startswith("TypeError") and "no CUDA device" in said[4], said
