"""gpu_check, part 3: a 2-rank all_reduce of CUDA arrays over TCP on one GPU.

Two processes share the GPU, as two ranks share a node, and all-reduce
torch.cuda tensors (ringreduce's own device arrays when torch has no CUDA):
every dtype x op on fresh random data, against the same numpy reference as the
kernel check (gpu_check.reference; avg halves the rounded sum in the compute
type, as the engine does). Then a float32 all_reduce is timed. Loopback TCP
bounds that time, so it measures the staging pipeline around the GPU, not the
GPU itself.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
import traceback
from typing import Any, Dict, Tuple

import numpy as np

from ringreduce.launch import free_port

FLOATS = ("float16", "bfloat16", "float32", "float64")


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _to_device(host: np.ndarray, dtype: str, device: int, torch: Any) -> Any:
    """host holds gpu_check's storage (bfloat16 as uint16 bits)."""
    if torch is not None:
        if dtype == "bfloat16":
            return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16).to(f"cuda:{device}")
        return torch.from_numpy(host).to(f"cuda:{device}")
    from ringreduce._arrays.cuda import DeviceArrayView

    if dtype == "bfloat16":
        import ml_dtypes  # the view needs a numpy bfloat16 dtype

        return DeviceArrayView.from_array(host.view(ml_dtypes.bfloat16), device)
    return DeviceArrayView.from_array(host, device)


def _to_host(arr: Any, dtype: str, torch: Any) -> np.ndarray:
    if torch is not None:
        t = arr.cpu()
        return t.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else t.numpy()
    host = arr.get()
    return host.view(np.uint16) if dtype == "bfloat16" else host


def _rank(rank: int, port: int, device: int, seed: int, count: int, mib: int) -> Dict:
    import gpu_check as gc

    import ringreduce as rr

    torch = _torch_cuda()
    if torch is not None:
        torch.cuda.set_device(device)
    dtypes = [d for d in gc.DTYPES if torch is not None or d != "bfloat16" or _has_ml_dtypes()]
    comm = rr.init(
        "tcp", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=120.0
    )
    # Both ranks draw the same a and b; rank 0 contributes a, rank 1 b.
    rng = np.random.default_rng(seed)
    wrong: Dict[Tuple[str, str], int] = {}
    for dtype in dtypes:
        _, _, to_compute, from_compute = gc.codec(dtype)
        for op in gc.OPS:
            if op == "avg" and dtype not in FLOATS:
                continue
            a, b = gc.random_data(dtype, count, rng), gc.random_data(dtype, count, rng)
            want = gc.reference(dtype, op, a, b)
            if op == "avg":
                with np.errstate(all="ignore"):
                    want = from_compute(to_compute(want) / 2)
            got = comm.all_reduce(_to_device((a, b)[rank], dtype, device, torch), op=op)
            wrong[(dtype, op)] = gc.count_wrong(dtype, op, _to_host(got, dtype, torch), want)

    n = mib * (1 << 20) // 4
    x = _to_device(np.ones(n, dtype=np.float32), "float32", device, torch)
    out = _to_device(np.zeros(n, dtype=np.float32), "float32", device, torch)
    comm.all_reduce(x, out=out)
    timed_wrong = int((_to_host(out, "float32", torch) != 2).sum())
    seconds = []
    for _ in range(5):
        comm.barrier()
        start = time.perf_counter()
        comm.all_reduce(x, out=out)
        seconds.append(time.perf_counter() - start)
    comm.close()
    arrays = "torch.cuda tensors" if torch is not None else "ringreduce device arrays"
    return {
        "wrong": wrong,
        "seconds": statistics.median(seconds),
        "timed_wrong": timed_wrong,
        "arrays": arrays,
    }


def _has_ml_dtypes() -> bool:
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def _serve(rank: int, port: int, args: tuple, conn: Any) -> None:
    try:
        conn.send(("ok", _rank(rank, port, *args)))
    except BaseException as exc:  # report, don't hang the parent
        conn.send(("err", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run(device: int, seed: int, count: int, mib: int = 256, timeout: float = 240.0) -> int:
    """Runs both ranks, prints a table; returns the number of wrong elements (-1: failed)."""
    port = free_port()
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    for rank in range(2):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_serve, args=(rank, port, (device, seed, count, mib), child))
        p.start()
        procs.append(p)
        conns.append(parent)
    deadline = time.monotonic() + timeout
    results = []
    for conn in conns:
        if conn.poll(max(0.0, deadline - time.monotonic())):
            results.append(conn.recv())
        else:
            results.append(("err", f"no answer within {timeout:.0f} s"))
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    if any(status != "ok" for status, _ in results):
        for status, value in results:
            if status != "ok":
                print(f"2-rank all_reduce FAILED: {value}")
        return -1
    return _report([value for _, value in results], count, mib)


def _report(ranks: list, count: int, mib: int) -> int:
    import gpu_check as gc

    print(
        f"\n2-rank all_reduce over TCP on one GPU ({ranks[0]['arrays']}), #wrong of {count} "
        "elements, per rank"
    )
    print(f"{'dtype':<10}" + "".join(f"{op:>11}" for op in gc.OPS))
    total = 0
    for dtype in gc.DTYPES:
        cells = []
        for op in gc.OPS:
            per_rank = [r["wrong"].get((dtype, op)) for r in ranks]
            if per_rank[0] is None:
                cells.append(f"{'-':>11}")
                continue
            total += sum(per_rank)
            cells.append(f"{'/'.join(str(w) for w in per_rank):>11}")
        print(f"{dtype:<10}" + "".join(cells))
    seconds = max(r["seconds"] for r in ranks)
    nbytes = mib * (1 << 20)
    algbw = nbytes / seconds / 1e9
    timed_wrong = sum(r["timed_wrong"] for r in ranks)
    total += timed_wrong
    print(
        f"float32 {mib} MiB all_reduce: {seconds * 1e3:.1f} ms, algbw {algbw:.2f} GB/s, "
        f"busbw {algbw:.2f} GB/s (2 ranks: x 2(N-1)/N = 1), #wrong {timed_wrong}"
    )
    return total
