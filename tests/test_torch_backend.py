"""ringreduce as a torch.distributed backend: ``init_process_group("ringreduce")``.

Every init method meets through torch's store; DDP (with comm hooks, no_sync and
join), FSDP2 and ZeroRedundancyOptimizer give the parameters they give on Gloo, in
float64; every ProcessGroup operation gives what Gloo gives; errors name the rank and
honour the timeout (test_torch_failures.py). PyTorch's own DistributedTest suite runs in
test_torch_backend_suite.py.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)
import torch.distributed as dist  # noqa: E402
from _torch_ranks import run  # noqa: E402

from _ranks import free_port  # noqa: E402


def _close(a, b, tol=1e-12):
    """Every array of a equals b's to tol (relative to its scale)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        if x.size:
            scale = max(1.0, float(np.abs(y).max()))
            assert float(np.abs(x - y).max()) <= tol * scale, (x, y)


# ---- rank-side functions --------------------------------------------------------


def _backend_name(rank, n):
    return dist.get_backend(), str(dist.group.WORLD)


def _every_operation(rank, n):
    """Each ProcessGroup operation through torch.distributed's public API; the results,
    to be compared across backends."""
    out = {}
    R = dist.ReduceOp
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(37, dtype=torch.float64, generator=g)
    for name, op in [
        ("sum", R.SUM),
        ("prod", R.PRODUCT),
        ("min", R.MIN),
        ("max", R.MAX),
        ("avg", R.AVG),
    ]:
        if name == "avg" and dist.get_backend() == "gloo":
            t = x.clone()
            dist.all_reduce(t)
            t /= n
        else:
            t = x.clone()
            dist.all_reduce(t, op=op)
        out[f"all_reduce_{name}"] = t
    ints = torch.arange(11, dtype=torch.int16) * (rank + 1)
    if dist.get_backend() == "gloo":  # Gloo has no int16: Invalid scalar type
        wide = ints.int()
        dist.all_reduce(wide)
        ints = wide.short()
    else:
        dist.all_reduce(ints)
    out["all_reduce_int16"] = ints
    z = torch.view_as_complex(torch.stack([x, x.flip(0)], dim=1).contiguous())
    dist.all_reduce(z)
    out["all_reduce_complex"] = torch.view_as_real(z).reshape(-1)
    zs = torch.empty(3, dtype=torch.complex128)
    dist.reduce_scatter_tensor(
        zs, torch.arange(3 * n, dtype=torch.float64).to(torch.complex128) * (1 + 2j) + rank
    )
    out["reduce_scatter_complex"] = torch.view_as_real(zs).reshape(-1)
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[rank % 3, 4]]),
        torch.tensor([1.5, 2.0], dtype=torch.float64) * (rank + 1),
        (6,),
    )
    dist.all_reduce(sparse)
    out["all_reduce_sparse"] = sparse.to_dense()
    flags = torch.tensor([rank == 0, True, False])
    dist.all_reduce(flags, op=R.MAX)
    out["all_reduce_bool_max"] = flags
    co = [x.clone(), x[:5].clone() * 2]
    dist.all_reduce_coalesced(co)
    out["all_reduce_coalesced"] = torch.cat(co)
    b = x.clone()
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b
    r = x.clone()
    dist.reduce(r, dst=1 % n, op=R.MAX)
    out["reduce"] = r if rank == 1 % n else x
    lst = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(lst, x)
    out["all_gather"] = torch.cat(lst)
    flat = torch.empty(n * 37, dtype=torch.float64)
    dist.all_gather_into_tensor(flat, x)
    out["all_gather_into_tensor"] = flat
    gl = [torch.empty_like(x) for _ in range(n)] if rank == 0 else None
    dist.gather(x, gl, dst=0)
    out["gather"] = torch.cat(gl) if rank == 0 else x
    sc = torch.empty(5, dtype=torch.float64)
    table = [torch.full((5,), float(i), dtype=torch.float64) for i in range(n)]
    dist.scatter(sc, table if rank == 0 else None, src=0)
    out["scatter"] = sc
    rs = torch.empty(5, dtype=torch.float64)
    dist.reduce_scatter(rs, [x[:5] * (i + 1) for i in range(n)])
    out["reduce_scatter"] = rs
    rst = torch.empty(4, dtype=torch.float64)
    dist.reduce_scatter_tensor(rst, torch.arange(4 * n, dtype=torch.float64) + rank)
    out["reduce_scatter_tensor"] = rst
    a2a_in = torch.arange(2 * n, dtype=torch.float64) + 100 * rank
    a2a_out = torch.empty(2 * n, dtype=torch.float64)
    dist.all_to_all_single(a2a_out, a2a_in)
    out["all_to_all_single"] = a2a_out
    splits_in = [(rank + d) % 3 for d in range(n)]
    splits_out = [(s + rank) % 3 for s in range(n)]
    uin = torch.arange(sum(splits_in), dtype=torch.float64) + 1000 * rank
    uout = torch.empty(sum(splits_out), dtype=torch.float64)
    dist.all_to_all_single(uout, uin, splits_out, splits_in)
    out["all_to_all_single_uneven"] = uout
    outs = [torch.empty(splits_out[s], dtype=torch.float64) for s in range(n)]
    if dist.get_backend() == "gloo":  # Gloo's list form takes equal blocks only
        outs = list(uout.split(splits_out))
    else:
        dist.all_to_all(outs, list(uin.split(splits_in)))
    out["all_to_all"] = torch.cat(outs)
    if n > 1:
        if rank == 0:
            for dst in range(1, n):
                dist.send(torch.full((3,), float(dst)), dst, tag=4)
            got = []
            for _ in range(n - 1):
                t = torch.empty(2)
                got.append((dist.recv(t, tag=5), t.tolist()))
            out["p2p"] = torch.tensor(sorted(got)[-1][1])
        else:
            t = torch.empty(3)
            dist.recv(t, 0, tag=4)
            dist.send(torch.tensor([float(rank), t[0].item()]), 0, tag=5)
            out["p2p"] = t
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    out["all_gather_object"] = torch.tensor([o["rank"] for o in objs])
    dist.barrier()
    return {k: v.double() if v.dtype != torch.bool else v for k, v in out.items()}


def _async_and_futures(rank, n):
    t = torch.full((1000,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    value = fut.wait()
    ok = work.is_completed() and work.is_success() and work.exception() is None
    return ok and bool((value == 2 * sum(range(n))).all()) and bool((t == sum(range(n))).all())


def _subgroups(rank, n):
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    sub, _ = dist.new_subgroups(group_size=2) if n % 2 == 0 else (None, None)
    res = {}
    t = torch.ones(3) * rank
    if rank % 2 == 0:
        dist.all_reduce(t, group=evens)
        res["evens"] = t.tolist()
    if sub is not None:
        u = torch.ones(2) * rank
        dist.all_reduce(u, group=sub)
        res["pairs"] = u.tolist()
        res["backend"] = dist.get_backend(sub)
    return res


def _ddp(rank, n, group_backend, hook, no_sync, uneven):
    """DDP on a small MLP, float64; returns the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    pg = dist.new_group(backend=group_backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 3),
    ).double()
    ddp = DDP(model, process_group=pg, bucket_cap_mb=0.002)
    if hook == "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(pg, default_hooks.allreduce_hook)
    elif hook == "custom":

        def scaled_sum(state, bucket):
            buf = bucket.buffer().div_(n)
            fut = dist.all_reduce(buf, group=state, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(pg, scaled_sum)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    steps = 6 + (rank if uneven else 0)
    g = torch.Generator().manual_seed(1 + rank)
    batches = [
        (
            torch.randn(8, 10, generator=g, dtype=torch.float64),
            torch.randn(8, 3, generator=g, dtype=torch.float64),
        )
        for _ in range(steps)
    ]

    def step(xb, yb):
        loss = torch.nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()

    from contextlib import nullcontext

    with ddp.join() if uneven else nullcontext():
        for i, (xb, yb) in enumerate(batches):
            opt.zero_grad()
            if no_sync and i % 2 == 0:
                with ddp.no_sync():
                    step(xb * 0.5, yb)
            step(xb, yb)
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _fsdp2(rank, n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 24),
        torch.nn.ReLU(),
        torch.nn.Linear(24, 24),
        torch.nn.ReLU(),
        torch.nn.Linear(24, 5),
    ).double()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(5):
        xb = torch.randn(6, 12, generator=g, dtype=torch.float64)
        loss = model(xb).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _zero(rank, n):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(9, 20), torch.nn.ReLU(), torch.nn.Linear(20, 20), torch.nn.Linear(20, 4)
    ).double()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(5):
        xb = torch.randn(6, 9, generator=g, dtype=torch.float64)
        ddp(xb).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if rank == 0 else None
    steps = None if state is None else sorted(float(s["step"]) for s in state["state"].values())
    return [p.detach().clone() for p in model.parameters()], steps


# ---- tests ----------------------------------------------------------------------


def test_registered_on_import():
    import ringreduce.torch  # noqa: F401

    assert "ringreduce" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["ringreduce"] == ["cpu", "cuda"]


@pytest.mark.parametrize("init", ["env", "tcp", "file", "store"])
def test_every_init_method(init, tmp_path):
    got = run(2, _backend_name, init=init, tmp=str(tmp_path))
    assert [g[0] for g in got] == ["ringreduce"] * 2


def test_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    # Each rank reports in a file of its own: lines printed by three processes into
    # one pipe can interleave.
    script.write_text(
        "import sys, torch, torch.distributed as dist, ringreduce.torch\n"
        "dist.init_process_group('ringreduce')\n"
        "t = torch.ones(4) * dist.get_rank()\n"
        "dist.all_reduce(t)\n"
        "assert t.tolist() == [3.0] * 4, t\n"
        "with open(f'{sys.argv[1]}/rank{dist.get_rank()}', 'w') as f:\n"
        "    f.write(f'ok {dist.get_backend()}')\n"
        "dist.destroy_process_group()\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "3",
        "--master-port",
        str(free_port()),
        str(script),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [(tmp_path / f"rank{r}").read_text() for r in range(3)]
    assert reports == ["ok ringreduce"] * 3, proc.stdout + proc.stderr


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_operation_gives_what_gloo_gives(n):
    ours = run(n, _every_operation)
    gloo = run(n, _every_operation, backend="gloo")
    for rank in range(n):
        assert ours[rank].keys() == gloo[rank].keys()
        for key in ours[rank]:
            a, b = ours[rank][key], gloo[rank][key]
            assert a.shape == b.shape and a.dtype == b.dtype, (rank, key)
            assert np.allclose(a, b, rtol=1e-12, atol=1e-12), (rank, key, a, b)


def test_async_work_and_futures():
    assert run(3, _async_and_futures) == [True] * 3


def test_subgroups_are_communicators_of_their_own():
    got = run(4, _subgroups)
    assert got[0]["evens"] == got[2]["evens"] == [2.0] * 3
    assert [g["pairs"] for g in got] == [[1.0] * 2, [1.0] * 2, [5.0] * 2, [5.0] * 2]
    assert {g["backend"] for g in got} == {"ringreduce"}


@pytest.mark.parametrize(
    "hook,no_sync,uneven",
    [
        (None, False, False),
        pytest.param("allreduce", False, False, marks=pytest.mark.extended),
        ("custom", True, False),
        (None, False, True),
    ],
)
def test_ddp_equals_gloo(hook, no_sync, uneven):
    # One job, two process groups: DDP over ringreduce and over Gloo, same data.
    n = 2 if uneven else 3
    ours = run(n, _ddp, "ringreduce", hook, no_sync, uneven, backend="gloo")
    gloo = run(n, _ddp, "gloo", hook, no_sync, uneven, backend="gloo")
    for rank in range(n):
        _close(ours[rank], gloo[rank])
        _close(ours[rank], ours[0], tol=0)  # replicas identical


def test_ddp_with_ringreduce_as_the_default_group():
    ours = run(2, _ddp, None, None, False, False)
    gloo = run(2, _ddp, None, None, False, False, backend="gloo")
    _close(ours[0], gloo[0])


def test_fsdp2_equals_gloo():
    ours = run(2, _fsdp2)
    gloo = run(2, _fsdp2, backend="gloo")
    _close(ours[0], gloo[0])
    _close(ours[1], ours[0], tol=0)


def test_zero_redundancy_optimizer_equals_gloo():
    ours = run(3, _zero)
    gloo = run(3, _zero, backend="gloo")
    _close(ours[0][0], gloo[0][0])
    assert ours[0][1] == gloo[0][1] and ours[0][1]  # the consolidated optimizer state
    for rank in range(3):
        _close(ours[rank][0], ours[0][0], tol=0)
