"""GradientBucketer / GradSync with compression: every bucket's result and residual are
bitwise those of ``comm.all_reduce(flat bucket, compression=..., error_feedback=flat
residual)`` called by hand; residuals are kept by parameter name, so they survive another
bucket plan and a state_dict round trip; under no_sync the accumulated gradient is
compressed once; PowerSGD buckets equal PowerSGD called by hand per bucket; the
combinations that cannot work are refused before any rank talks.

"By hand" replays the bucketer's calls with the same call numbers (the compressed
collective seeds its stochastic rounding from them), so int8/int4 compare bitwise too.
Rank-side functions are module level so the rank processes can unpickle them.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
from _bucketing_compression_rank import SHAPES as FT_SHAPES
from _bucketing_compression_rank import grads
from _grads import MEMORY, handing_over

from ringreduce._comm.compressed.route import _state
from ringreduce.bucketing import GradientBucketer
from ringreduce.compression import ErrorFeedback
from ringreduce.compression.powersgd import PowerSGD

from _ranks import free_port, run_scripts

# Registered first layer first; buckets fill from the last.
SHAPES = {"w0": (40, 30), "b0": (30,), "w1": (30, 20), "b1": (20,), "w2": (20, 700)}


def grads_of(rank: int, step: int, micro: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng([rank, step, micro])
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def make(comm, bucket_kb: float, dtype=np.float32, **kw) -> GradientBucketer:
    b = GradientBucketer(comm, bucket_mb=bucket_kb / 1024, first_bucket_mb=bucket_kb / 1024, **kw)
    for name, shape in SHAPES.items():
        b.register(name, shape, dtype)
    return b


def step(b: GradientBucketer, grads: dict) -> dict:
    """One synchronised step, last layer first; returns the reduced gradients."""
    out = {k: v.copy() for k, v in grads.items()}
    for h, name in reversed(list(enumerate(SHAPES))):
        b.ready(h, out[name])
    b.wait()
    return out


def residuals(b: GradientBucketer) -> dict:
    ef = b.error_feedback
    return {k: ef.key(k).residual(int(np.prod(SHAPES[k]))).copy() for k in ef.keys()}


def by_hand(comm, plan, grads: dict, res: dict, codec, calls: int) -> tuple[dict, dict]:
    """Each bucket of ``plan`` as one comm.all_reduce of its flat float32 gradients, in
    plan order, from call number ``calls``; returns the results and the new residuals."""
    _state(comm).calls = calls
    out, new = {}, {}
    for names in plan:
        flat = np.concatenate([grads[n].astype(np.float32).reshape(-1) for n in names])
        r = None
        if res is not None:
            r = np.concatenate([res.get(n, np.zeros(grads[n].size, np.float32)) for n in names])
        got = comm.all_reduce(flat, "avg", compression=codec, error_feedback=r)
        at = 0
        for n in names:
            size = grads[n].size
            out[n] = got[at : at + size].reshape(SHAPES[n])
            if r is not None:
                new[n] = r[at : at + size]
            at += size
    return out, new


def check_step(comm, b, grads, codec, ef: bool) -> dict:
    """A bucketer step against the same step by hand; returns the max differences."""
    before = residuals(b) if ef and b.error_feedback.keys() else ({} if ef else None)
    calls = _state(comm).calls
    got = step(b, grads)
    want, new = by_hand(comm, b.plan, grads, before, codec, calls)
    diff = {
        "result": max(float(np.abs(got[k] - want[k].astype(got[k].dtype)).max()) for k in SHAPES)
    }
    if ef:
        after = residuals(b)
        diff["residual"] = max(float(np.abs(after[k] - new[k]).max()) for k in SHAPES)
    return diff


def equals_by_hand_rank(comm, codec: str, ef: bool, dtype: str) -> list:
    b = make(comm, 4.0, compression=codec, error_feedback=ef, dtype=np.dtype(dtype))
    assert len(b.plan) >= 3, b.plan
    return [
        check_step(comm, b, grads_of(comm.rank, s, dtype=np.dtype(dtype)), codec, ef)
        for s in range(3)
    ]


@pytest.mark.parametrize(
    "codec, ef, dtype",
    [
        ("bf16", False, "float32"),
        ("int8", True, "float32"),
        ("int4", True, "float32"),
        ("int8", True, "float64"),
        ("fp16", True, "float32"),
    ],
)
def test_each_bucket_is_the_compressed_all_reduce_of_the_flat_bucket(
    group_factory, codec, ef, dtype
):
    for rank_diffs in group_factory(3).run(equals_by_hand_rank, codec, ef, dtype):
        for d in rank_diffs:
            assert all(v == 0.0 for v in d.values()), d


def device_buckets_rank(comm, codec: str) -> list:
    """Three steps of a compressed bucketer with error feedback, gradients in host memory
    and then on the fake device, each run from call number 0: per run, the reduced
    gradients and the saved residuals as bytes, and the type of each flat residual."""
    runs = []
    for memory in MEMORY:
        with handing_over(memory) as (wrap, _):
            _state(comm).calls = 0
            b = make(comm, 4.0, compression=codec, error_feedback=True)
            got = []
            for s in range(3):
                out = grads_of(comm.rank, s)
                for h, name in reversed(list(enumerate(SHAPES))):
                    b.ready(h, wrap(out[name]))
                b.wait()
                got.append({k: v.tobytes() for k, v in out.items()})
            saved = b.state_dict()["error_feedback"]["residuals"]
            flats = sorted({type(f).__name__ for f in b._compress._flats})
            runs.append((got, {k: v.tobytes() for k, v in saved.items()}, flats))
    return runs


@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_device_buckets_compress_to_the_host_buckets_bits(group_factory, codec):
    for (host, host_res, host_flats), (dev, dev_res, dev_flats) in group_factory(
        2, fake_device=True
    ).run(device_buckets_rank, codec):
        assert host_flats == ["ndarray"] and dev_flats == ["FakeCudaArray"]
        assert len(host_res) == len(SHAPES) and dev_res == host_res
        assert dev == host


def powersgd_on_device_rank(comm) -> str:
    with handing_over("fake-device") as (wrap, _):
        b = make(comm, 4.0, powersgd_rank=1)
        g = grads_of(comm.rank, 0)
        try:
            for h, name in reversed(list(enumerate(SHAPES))):
                b.ready(h, wrap(g[name]))
            b.wait()
        except TypeError as e:
            return str(e)
    return "no error"


def test_powersgd_refuses_device_gradients_by_name(group_factory):
    for message in group_factory(2, fake_device=True).run(powersgd_on_device_rank):
        assert "PowerSGD runs on host gradients" in message and "cuda:0" in message, message


def rebucketing_rank(comm) -> dict:
    small = make(comm, 4.0, compression="int8", error_feedback=True)
    for s in range(2):
        step(small, grads_of(comm.rank, s))
    saved = small.state_dict()
    big = make(comm, 4096.0, compression="int8", error_feedback=True)  # one bucket
    big.load_state_dict(saved)
    same_plan = make(comm, 4.0, compression="int8", error_feedback=True)
    same_plan.load_state_dict(saved)
    same = [float(np.abs(residuals(same_plan)[k] - residuals(small)[k]).max()) for k in SHAPES]
    loaded_early = {
        k: float(np.abs(v - saved["error_feedback"]["residuals"][k]).max())
        for k, v in residuals(big).items()
    }
    diffs = [
        check_step(comm, big, grads_of(comm.rank, 2), "int8", True),
        check_step(comm, same_plan, grads_of(comm.rank, 2), "int8", True),
        check_step(comm, small, grads_of(comm.rank, 2), "int8", True),
    ]
    return {
        "plans": [len(small.plan), len(big.plan)],
        "keys": sorted(saved["error_feedback"]["residuals"]),
        "norm": small.error_feedback.norm(),
        "loaded": loaded_early,
        "diffs": diffs,
        "same": same,
    }


def test_residuals_are_kept_by_name_across_bucket_plans_and_state_dicts(group_factory):
    for r in group_factory(2).run(rebucketing_rank):
        assert r["plans"][0] >= 3 and r["plans"][1] == 1
        assert r["keys"] == sorted(SHAPES) and r["norm"] > 0
        assert all(v == 0.0 for v in r["loaded"].values()), r["loaded"]
        for d in r["diffs"]:
            assert d == {"result": 0.0, "residual": 0.0}, d
        assert r["same"] == [0.0] * len(SHAPES)  # loaded into the same plan: the same residuals


def no_sync_rank(comm, micro: int) -> dict:
    b = make(comm, 4.0, compression="int8", error_feedback=True)
    step(b, grads_of(comm.rank, 0))  # residuals from a first step
    before, calls = residuals(b), _state(comm).calls
    total = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    with b.no_sync():
        for m in range(micro):
            g = grads_of(comm.rank, 1, m)
            for h, name in reversed(list(enumerate(SHAPES))):
                b.ready(h, g[name])
                total[name] += g[name]
            b.wait()
    quiet = _state(comm).calls == calls and all(
        np.array_equal(v, before[k]) for k, v in residuals(b).items()
    )
    last = grads_of(comm.rank, 1, micro)
    for k in SHAPES:
        total[k] += last[k]
    got = step(b, last)
    want, new = by_hand(comm, b.plan, total, before, "int8", calls)
    after = residuals(b)
    return {
        "quiet": quiet,
        "calls": _state(comm).calls - calls,
        "result": max(float(np.abs(got[k] - want[k]).max()) for k in SHAPES),
        "residual": max(float(np.abs(after[k] - new[k]).max()) for k in SHAPES),
        "buckets": len(b.plan),
    }


def test_no_sync_compresses_the_accumulated_gradient_once(group_factory):
    for r in group_factory(2).run(no_sync_rank, 3):
        assert r["quiet"]  # nothing sent, no residual touched inside no_sync
        assert r["calls"] == r["buckets"]  # one compressed call per bucket at the sync
        assert r["result"] == 0.0 and r["residual"] == 0.0, r


def powersgd_rank_fn(comm) -> dict:
    b = make(comm, 8.0, powersgd_rank=2)
    hand = PowerSGD(comm, 2)
    diffs = []
    for s in range(3):
        if s == 2:  # another plan, loaded from the state: PowerSGD's state is by name
            saved = b.state_dict()
            b = make(comm, 4096.0, powersgd_rank=2)
            b.load_state_dict(saved)
        g = grads_of(comm.rank, s)
        got = step(b, g)
        want = {k: v.copy() for k, v in g.items()}
        works = [hand.start([want[n] for n in names], names) for names in b.plan]
        for w in works:
            w.wait()
        diffs.append(max(float(np.abs(got[k] - want[k]).max()) for k in SHAPES))
    sd = b.state_dict()
    exact = comm.all_reduce(g["b0"], "avg")
    return {
        "diffs": diffs,
        "residual_keys": sorted(sd["powersgd"]["residuals"]),
        "vector_exact": float(np.abs(got["b0"] - exact).max()),
        "ef": sd["error_feedback"],
        "rate": hand.stats()["rate"],
    }


def test_powersgd_buckets_equal_powersgd_by_hand(group_factory):
    for r in group_factory(2).run(powersgd_rank_fn):
        assert r["diffs"] == [0.0, 0.0, 0.0]
        assert r["residual_keys"] == ["w0", "w1", "w2"]  # matrices only
        assert r["vector_exact"] < 1e-6 and r["ef"] is None and r["rate"] > 2


def test_combinations_that_cannot_work_are_refused_before_any_rank_talks():
    comm = types.SimpleNamespace(rank=0, world_size=2)
    with pytest.raises(ValueError, match="unknown codec"):
        GradientBucketer(comm, compression="int7")
    with pytest.raises(ValueError, match="needs compression"):
        GradientBucketer(comm, error_feedback=True)
    with pytest.raises(ValueError, match="pass one of them"):
        GradientBucketer(comm, compression="int8", powersgd_rank=4)
    with pytest.raises(ValueError, match="fault_tolerant"):
        GradientBucketer(comm, powersgd_rank=4, fault_tolerant=True)
    with pytest.raises(ValueError, match="average=True"):
        GradientBucketer(comm, powersgd_rank=4, average=False)
    b = GradientBucketer(comm, compression="int8", error_feedback=ErrorFeedback())
    assert b.error_feedback is not None
    assert GradientBucketer(comm).state_dict() == {
        "version": 1,
        "error_feedback": None,
        "powersgd": None,
    }


def gradsync_rank(comm) -> dict:
    import torch

    import ringreduce as rr

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    out = {}
    for kind, kw in (
        ("int8", {"compression": "int8", "error_feedback": True}),
        ("powersgd", {"powersgd_rank": 2}),
    ):
        sync = rr.torch.GradSync(model, comm, bucket_mb=0.002, first_bucket_mb=0.001, **kw)
        errs = []
        for s in range(3):
            g = torch.Generator().manual_seed(100 * comm.rank + s)
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            exact = [comm.all_reduce(p.grad.numpy().copy(), "avg") for p in model.parameters()]
            sync.wait()
            errs.append(
                max(
                    float(np.linalg.norm(p.grad.numpy() - e) / np.linalg.norm(e))
                    for p, e in zip(model.parameters(), exact)
                )
            )
        state = sync.state_dict()
        flat = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
        out[kind] = {
            "err": errs,
            "bits": flat.tobytes(),
            "ef": sorted((state["error_feedback"] or {"residuals": {}})["residuals"]),
            "ps": sorted((state["powersgd"] or {"q": {}})["q"]),
        }
        sync.remove()
    return out


def test_gradsync_compresses_with_torch(group_factory):
    pytest.importorskip("torch", reason="needs torch (the CPU wheel is enough)")
    ranks = group_factory(2).run(gradsync_rank)
    names = ["0.bias", "0.weight", "2.bias", "2.weight"]
    for r in ranks:
        # Per step, error feedback moves each gradient by the residuals' change (a few %
        # for these small tensors); what stays is bounded, not lost.
        assert max(r["int8"]["err"]) < 0.2, r["int8"]["err"]
        assert r["int8"]["ef"] == names
        assert r["powersgd"]["ps"] == ["0.weight"]  # 2.weight (4 x 32) would not shrink at rank 2
    for kind in ("int8", "powersgd"):
        assert ranks[0][kind]["bits"] == ranks[1][kind]["bits"]  # bitwise identical ranks


def test_a_compressed_fault_tolerant_step_that_loses_a_rank_ends_with_the_survivors(tmp_path):
    """int8 + error feedback, fault_tolerant=True: a rank dies after the first bucket was
    reduced with it; the survivors replay every bucket from its contribution and residual
    as launched and end with their own average (within int8's error), identically."""
    script = os.path.join(os.path.dirname(__file__), "_bucketing_compression_rank.py")
    n, victim, port = 3, 1, free_port()
    reports = run_scripts(script, lambda r: [r, n, port, victim], n, victim)
    survivors = [r for r in range(n) if r != victim]
    for step, ranks in ((0, range(n)), (1, survivors)):
        got = reports[survivors[0]]["steps"][step]
        assert got["world"] == len(ranks)
        for i, s in enumerate(FT_SHAPES):
            want = np.mean([grads(r, step)[i] for r in ranks], axis=0)
            g = np.asarray(got["grads"][i]).reshape(s)
            assert np.linalg.norm(g - want) / np.linalg.norm(want) < 0.1, (step, i)
        assert set(got["residual_norm"]) == {"p0", "p1", "p2"}
    for step in range(2):  # replicas identical, bit for bit (residuals are each rank's own)
        assert reports[0]["steps"][step]["grads"] == reports[2]["steps"][step]["grads"]
