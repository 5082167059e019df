"""rr.torch: GradSync against torch DDP on Gloo, no_sync, unused parameters, bfloat16 and
broadcast_parameters. Skipped when torch is not installed."""

from __future__ import annotations

import contextlib
import copy
import os
import time

import numpy as np
import pytest

pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)

from _ranks import free_port

pytestmark = pytest.mark.torch

D_IN, HIDDEN, D_OUT = 8, 32, 4


def _model():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, D_OUT),
    )


def _batch(step: int, micro: int, rows: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed * 10_000 + step * 10 + micro)
    return torch.randn(rows, D_IN, generator=g), torch.randn(rows, D_OUT, generator=g)


def ddp_vs_gradsync_rank(
    comm,
    port: int,
    steps: int,
    micro_steps: int,
    seed: int,
    as_view: bool = False,
    set_to_none: bool = True,
):
    """Rank side: one model trained under DDP (Gloo), a copy under GradSync, same data.
    Also returns whether, at the end, every .grad of ours is its bucket's memory."""
    import torch
    import torch.distributed as dist

    import ringreduce as rr

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.world_size
    )
    try:
        torch.manual_seed(seed)
        base = _model()
        ours = copy.deepcopy(base)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base))
        sync = rr.torch.GradSync(
            ours, comm, bucket_mb=0.004, first_bucket_mb=0.001, gradient_as_bucket_view=as_view
        )
        opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
        b = 6
        rows = slice(comm.rank * b, (comm.rank + 1) * b)
        loss_fn = torch.nn.MSELoss()
        for step in range(steps):
            for model, opt, no_sync in (
                (ddp, opt_ddp, ddp.no_sync),
                (ours, opt_ours, sync.no_sync),
            ):
                opt.zero_grad(set_to_none=set_to_none)
                for micro in range(micro_steps):
                    x, y = _batch(step, micro, comm.world_size * b, seed)
                    last = micro == micro_steps - 1
                    with no_sync() if not last else contextlib.nullcontext():
                        loss_fn(model(x[rows]), y[rows]).backward()
                if model is ours:
                    sync.wait()
                opt.step()
        handles = range(len(list(ours.parameters())))
        in_buckets = all(
            p.grad.data_ptr() == sync.bucketer.view(h).ctypes.data
            for h, p in zip(handles, ours.parameters())
        )
        result = (
            [p.detach().numpy().copy() for p in ddp.module.parameters()],
            [p.detach().numpy().copy() for p in ours.parameters()],
            len(sync.bucketer.plan),
            in_buckets,
        )
        # Quiet torch's Gloo workers before the reference side is torn down. A worker
        # drops a finished work's last reference on its own thread, which takes the GIL;
        # if the process group is destroyed meanwhile (a join of those threads, under the
        # GIL, from DDP's Reducer going away), torch deadlocks: seen once in CI, rank 1 in
        # ~ProcessGroupGloo joining a runLoop thread blocked on the GIL in
        # ~AsyncAllreduceWork. A barrier, then a moment with the GIL released, lets every
        # worker finish first.
        dist.barrier()
        time.sleep(0.1)
        return result
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "as_view, set_to_none",
    [(False, True), (True, True), (True, False)],
    ids=["copies", "bucket-view, set_to_none", "bucket-view, zeroed in place"],
)
@pytest.mark.parametrize("micro_steps", [1, 3])
def test_gradsync_matches_ddp_on_gloo(group_factory, micro_steps, as_view, set_to_none):
    results = group_factory(2).run(
        ddp_vs_gradsync_rank, free_port(), 5, micro_steps, 7, as_view, set_to_none
    )
    initial = [p.detach().numpy() for p in _seeded_model(7).parameters()]
    for ddp_params, our_params, n_buckets, in_buckets in results:
        assert n_buckets > 1
        assert in_buckets == as_view
        for theirs, mine, start in zip(ddp_params, our_params, initial):
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-6)
            assert np.abs(mine - start).max() > 1e-3  # training moved it
    for mine, theirs in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(mine, theirs)  # replicas identical


def _seeded_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return _model()


def unused_rank(comm):
    """A head only rank 0 uses; all replicas must still take identical steps."""
    import torch

    import ringreduce as rr

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(4, 4), "head": torch.nn.Linear(4, 2)})
    sync = rr.torch.GradSync(model, comm, bucket_mb=1e-9, first_bucket_mb=1e-9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(3):
        opt.zero_grad()
        x = torch.full((3, 4), float(comm.rank + step + 1))
        out = model["body"](x).sum()
        if comm.rank == 0:
            out = out + model["head"](x).sum()
        out.backward()
        sync.wait()
        grads.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
        opt.step()
    return grads, [p.detach().numpy().copy() for p in model.parameters()]


def test_unused_parameters_get_the_average(group_factory):
    results = group_factory(2).run(unused_rank)
    (grads0, params0), (grads1, params1) = results
    for g0, g1 in zip(grads0, grads1):
        assert g0.keys() == g1.keys()
        for name in g0:
            np.testing.assert_array_equal(g0[name], g1[name])
    assert np.abs(grads1[0]["head.weight"]).max() > 0  # rank 1 received rank 0's half
    for p0, p1 in zip(params0, params1):
        np.testing.assert_array_equal(p0, p1)


def bf16_rank(comm):
    import torch

    import ringreduce as rr

    weight = torch.nn.Parameter(torch.ones(5, 3, dtype=torch.bfloat16))
    module = torch.nn.Module()
    module.weight = weight
    sync = rr.torch.GradSync(module, comm)
    (weight * float(comm.rank + 1)).sum().backward()
    sync.wait()
    return weight.grad.float().numpy(), str(weight.grad.dtype)


def test_bfloat16_gradients(group_factory):
    pytest.importorskip("ml_dtypes", reason="needs ml_dtypes: pip install -e '.[test]' brings it")
    n = 2
    for grad, dtype in group_factory(n).run(bf16_rank):
        assert dtype == "torch.bfloat16"
        np.testing.assert_array_equal(grad, np.full((5, 3), (n + 1) / 2, np.float32))


def broadcast_rank(comm):
    import torch

    import ringreduce as rr

    torch.manual_seed(100 + comm.rank)  # every rank starts different
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model[1].running_mean.uniform_()
    model[1].num_batches_tracked.fill_(comm.rank + 5)
    rr.torch.broadcast_parameters(model, comm, root=1)
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_broadcast_parameters_copies_root(group_factory):
    results = group_factory(3).run(broadcast_rank)
    for state in results:
        assert state.keys() == results[1].keys()
        for key in state:
            np.testing.assert_array_equal(state[key], results[1][key])
    assert int(results[0]["1.num_batches_tracked"]) == 6


def test_remove_stops_synchronising():
    import torch

    import ringreduce as rr

    class _OneRank:
        rank, world_size = 0, 1

    model = torch.nn.Linear(2, 2)
    sync = rr.torch.GradSync(model, _OneRank())
    sync.remove()
    model(torch.ones(1, 2)).sum().backward()  # with hooks this would need the communicator
    assert sync.bucketer.plan == [["bias", "weight"]]
