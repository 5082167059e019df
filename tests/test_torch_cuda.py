"""The torch.distributed backend with CUDA tensors: ``init_process_group("ringreduce")``
and DDP on a GPU, as a torch user runs them.

Both ranks use GPU 0 (the tests need one GPU). Every result is compared with the
same call on CPU tensors on the same backend: the CUDA kernels give the CPU
kernels' bits, so the collectives must match exactly, and DDP's parameters to
float64 rounding (the GPU's matrix products round differently from the CPU's).
Skipped without torch built with CUDA and a GPU; run by bench/gpu_check.sh.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)
if not torch.cuda.is_available():
    pytest.skip("needs torch built with CUDA (a CUDA wheel) and a GPU", allow_module_level=True)

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _torch_ranks import run  # noqa: E402


def _collectives(rank, n, device):
    """Each collective on float32, bfloat16 and int64 tensors of `device`; results on the CPU."""
    if device == "cuda":
        torch.cuda.set_device(0)
    R = dist.ReduceOp
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        # 2 elements: the bulletin on shared memory; 1000: the direct path; 300001: the ring.
        for count in (2, 1000, 300_001):
            g = torch.Generator().manual_seed(1000 * rank + count)
            base = torch.randint(-50, 50, (count,), generator=g).to(dtype).to(device)
            for name, op in (("sum", R.SUM), ("max", R.MAX), ("min", R.MIN)):
                t = base.clone()
                dist.all_reduce(t, op=op)
                out[f"all_reduce {name} {dtype} {count}"] = t
            if dtype != torch.int64:
                t = base.clone()
                dist.all_reduce(t, op=R.AVG)
                out[f"all_reduce avg {dtype} {count}"] = t
            t = base.clone()
            dist.broadcast(t, src=1)
            out[f"broadcast {dtype} {count}"] = t
            rows = torch.empty(n * count, dtype=dtype, device=device)
            dist.all_gather_into_tensor(rows, base)
            out[f"all_gather_into_tensor {dtype} {count}"] = rows
            block = torch.empty(count, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(block, torch.cat([base * (i + 1) for i in range(n)]))
            out[f"reduce_scatter_tensor {dtype} {count}"] = block
    assert all(t.device.type == device for t in out.values())
    return {k: v.cpu().double() for k, v in out.items()}


def _ddp(rank, n, device):
    """DDP on a small MLP in float64 with ringreduce as the default group; the final
    parameters and each step's loss averaged over the ranks."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if device == "cuda":
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(
            torch.nn.Linear(10, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 3),
        )
        .double()
        .to(device)
    )
    ddp = DDP(model, device_ids=[0] if device == "cuda" else None, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(6):
        xb = torch.randn(16, 10, generator=g, dtype=torch.float64).to(device)
        yb = torch.randn(16, 3, generator=g, dtype=torch.float64).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        # The usual logging call: a one-element all_reduce of a CUDA tensor.
        seen = loss.detach().clone()
        dist.all_reduce(seen, op=dist.ReduceOp.AVG)
        losses.append(seen.item())
    return [p.detach().cpu() for p in model.parameters()], torch.tensor(losses)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_collectives_on_cuda_tensors_give_the_cpu_bits(monkeypatch, transport):
    monkeypatch.setenv("RINGREDUCE_TRANSPORT", transport)
    cuda = run(2, _collectives, "cuda")
    cpu = run(2, _collectives, "cpu")
    for rank in range(2):
        assert cuda[rank].keys() == cpu[rank].keys()
        wrong = [k for k in cpu[rank] if not np.array_equal(cuda[rank][k], cpu[rank][k])]
        assert not wrong, f"rank {rank}: {wrong}"


def test_ddp_on_cuda_equals_ddp_on_cpu():
    cuda = run(2, _ddp, "cuda")
    cpu = run(2, _ddp, "cpu")
    for rank in range(2):
        params, losses = cuda[rank]
        want_params, want_losses = cpu[rank]
        for p, q in zip(params, want_params):
            assert np.allclose(p, q, rtol=1e-10, atol=1e-12)
        assert np.allclose(losses, want_losses, rtol=1e-10, atol=1e-12)
        # Replicas identical, and every rank logged the same loss.
        assert all(np.array_equal(p, q) for p, q in zip(params, cuda[0][0]))
        assert np.array_equal(losses, cuda[0][1])


def _window_tensors(rank, n):
    """``ringreduce.torch.empty(..., device="cuda")``: CUDA tensors in device windows;
    dist.all_reduce on them takes the window path and gives the CPU tensors' bits."""
    import ringreduce.torch as rrt

    torch.cuda.set_device(0)
    comm = rrt.communicator()
    before = comm.stats()["all_reduce_algorithms"]["window"]
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for count in (2, 1000, 300_001):
            g = torch.Generator().manual_seed(1000 * rank + count)
            base = torch.randint(-50, 50, (count,), generator=g).to(dtype)
            w = rrt.empty(count, dtype=dtype, device="cuda")
            assert w.is_cuda and w.dtype == dtype and w.shape == (count,)
            w.copy_(base)
            dist.all_reduce(w)
            cpu = base.clone()
            dist.all_reduce(cpu)
            out[f"{dtype} {count}"] = bool(torch.equal(w.cpu(), cpu))
    out["window calls"] = comm.stats()["all_reduce_algorithms"]["window"] - before
    return out


def test_window_tensors_on_cuda_take_the_window_path_with_the_cpu_bits(monkeypatch):
    monkeypatch.setenv("RINGREDUCE_TRANSPORT", "shm")
    for said in run(2, _window_tensors):
        calls = said.pop("window calls")
        assert all(said.values()), said
        assert calls == len(said), calls
