"""all_reduce of GPU tensors between ranks of one host: ringreduce's transports
against Gloo's CUDA all_reduce, in the same run.

    python bench/gpu_transports.py [-n 2] [--transports tcp,shm] [--sizes 64K,1M,16M,256M]

A transport may carry settings for its ranks' environment, which its table's
heading repeats: `--transports shm,shm:RINGREDUCE_SHM_SINGLE_COPY_BYTES=65536` runs
shared memory as it is and again with messages of 64 KiB and more read by address
(one host copy per byte instead of two, for the staged rows too). The setting `MPS`
runs that transport's ranks under CUDA MPS (`shm:MPS`: a daemon of the harness's own,
bench/_mps.py, for that run only; skipped, saying why, where MPS cannot run), so that
ranks sharing a GPU are timed with and without time slicing.

Every rank uses the same GPU (cuda:0, or --device), as ranks of one node share a
host. Per size and round, in turn: ringreduce's all_reduce of a torch.cuda tensor
(staged through host memory by the engine), the same queued
(async_op=True, then wait(): the worker's polite waits), ringreduce's all_reduce of a
numpy array of the same size (the transport alone, no GPU), and Gloo's all_reduce
of the torch.cuda tensor (torch.distributed, which stages through the host as
well). Each call is float32 sum, out of place for ringreduce, in place for Gloo;
times are per call, medians of --rounds rounds of back-to-back calls, each block
ended by torch.cuda.synchronize(). The first call of each system at each size is
checked. Without a GPU it runs on CPU tensors (a test of the harness only).

On a GPU two more systems run: "ours window", the all_reduce of tensors in device
windows (comm.empty(..., device=...), which every rank maps through CUDA IPC: each
rank's kernels reduce its chunk straight out of the others' memory), and the copies
the targets are measured against, "d2d copy" (device to device, torch's copy_) and
"h2d copy" (pinned host to device, non-blocking), whose columns are copy bandwidth
(bytes / time) rather than busbw. The last lines give the ratios: the window's busbw
against the device copy's bandwidth, the staged call's against the pinned copy's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from typing import Any, Dict, List

import numpy as np
from _mps import environment, mps_daemon  # bench/, this script's directory

from ringreduce.bench.data import parse_size
from ringreduce.launch import free_port

SYSTEMS = (
    "ours device",
    "ours device async",
    "ours window",
    "ours host",
    "gloo device",
    "d2d copy",
    "h2d copy",
)
# Not collectives: their columns are bytes / time, and they need a GPU, as windows do.
COPIES = ("d2d copy", "h2d copy")
GPU_ONLY = ("ours window", *COPIES)


def _iters(nbytes: int) -> int:
    return max(3, min(50, (64 << 20) // max(nbytes, 1)))


def split_transport(spec: str) -> tuple:
    """ "shm:VAR=value:VAR2=value2:MPS" -> ("shm", {"VAR": "value", "VAR2": "value2"}, True)."""
    name, *settings = spec.split(":")
    env = {}
    mps = False
    for setting in settings:
        if setting == "MPS":
            mps = True
            continue
        var, eq, value = setting.partition("=")
        if not eq or not var.startswith("RINGREDUCE_"):
            raise SystemExit(
                f"--transports: {setting!r} in {spec!r} is not RINGREDUCE_...=value or MPS"
            )
        env[var] = value
    return name, env, mps


def _rank(rank: int, args: Any, ports: List[int], spec: str) -> Dict[str, List[float]]:
    transport, env, _ = split_transport(spec)
    os.environ.update(env)  # before init, which reads them; this process is this rank's alone
    import torch
    import torch.distributed as dist

    import ringreduce as rr

    device = args.device if args.device == "cpu" or torch.cuda.is_available() else "cpu"
    if device != "cpu":
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    n = args.nprocs
    comm = rr.init(
        transport,
        rank=rank,
        world_size=n,
        master_addr="127.0.0.1",
        master_port=ports[0],
        timeout=120.0,
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank, world_size=n
    )
    want = n * (n + 1) / 2
    times: Dict[str, List[float]] = {}
    for nbytes in args.sizes:
        count = nbytes // 4
        x = torch.full((count,), float(rank + 1), device=device)
        out = torch.empty_like(x)
        g = x.clone()
        h, hout = np.full(count, rank + 1, np.float32), np.empty(count, np.float32)
        calls = {
            "ours device": lambda x=x, out=out: comm.all_reduce(x, out=out),
            "ours device async": lambda x=x, out=out: comm.all_reduce(
                x, out=out, async_op=True
            ).wait(),
            "ours host": lambda h=h, hout=hout: comm.all_reduce(h, out=hout),
            "gloo device": lambda g=g: dist.all_reduce(g),
        }
        results = {"ours host": hout, "gloo device": g}
        if device != "cpu":
            index = torch.device(device).index or 0
            if "ours window" in args.systems:
                # Collective: every rank makes its windows in the same order.
                wx = torch.as_tensor(comm.empty(count, np.float32, device=index), device=device)
                wout = torch.as_tensor(comm.empty(count, np.float32, device=index), device=device)
                wx.fill_(float(rank + 1))
                calls["ours window"] = lambda wx=wx, wout=wout: comm.all_reduce(wx, out=wout)
                results["ours window"] = wout
            src = torch.full_like(x, float(want))
            d2d, h2d = torch.empty_like(x), torch.empty_like(x)
            pinned = torch.full((count,), float(want), pin_memory=True)
            calls["d2d copy"] = lambda d2d=d2d, src=src: d2d.copy_(src)
            calls["h2d copy"] = lambda h2d=h2d, pinned=pinned: h2d.copy_(pinned, non_blocking=True)
            results["d2d copy"], results["h2d copy"] = d2d, h2d
        calls = {name: call for name, call in calls.items() if name in args.systems}
        for name, call in calls.items():  # warm up, and check the first result
            call()
            sync()
            got = results.get(name, out)
            got = got.cpu().numpy() if hasattr(got, "cpu") else got
            if not np.all(got == want):
                raise AssertionError(f"rank {rank}: {name} at {nbytes} B gave wrong values")
        iters = _iters(nbytes)
        for name in calls:
            rounds = []
            for _ in range(args.rounds):
                comm.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    calls[name]()
                sync()
                rounds.append((time.perf_counter() - start) / iters)
            times[f"{name} {nbytes}"] = rounds
    dist.destroy_process_group()
    comm.close()
    return times


def _serve(rank: int, args: Any, ports: List[int], transport: str, conn: Any) -> None:
    try:
        conn.send(("ok", _rank(rank, args, ports, transport)))
    except BaseException as exc:  # report, don't hang the parent
        conn.send(("err", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_transport(args: Any, transport: str) -> int:
    if split_transport(transport)[2]:
        with mps_daemon() as (env, why):
            if env is None:
                print(f"\n{transport}: skipped: {why}")
                return 0
            return _run_transport(args, transport, env)
    return _run_transport(args, transport, {})


def _run_transport(args: Any, transport: str, env: Dict[str, str]) -> int:
    """Runs the ranks of one transport, with `env` (MPS's) set for their processes."""
    ctx = mp.get_context("spawn")
    ports = [free_port(), free_port()]
    procs, conns = [], []
    with environment(env):  # inherited by the ranks' processes as they start
        for rank in range(args.nprocs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(rank, args, ports, transport, child))
            p.start()
            procs.append(p)
            conns.append(parent)
    deadline = time.monotonic() + args.timeout
    results = []
    for conn in conns:
        ok = conn.poll(max(0.0, deadline - time.monotonic()))
        results.append(conn.recv() if ok else ("err", f"no answer in {args.timeout:.0f} s"))
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    failed = [value for status, value in results if status != "ok"]
    if failed:
        print(f"{transport}: FAILED\n" + "\n".join(failed))
        return 1
    # A call's time is the slowest rank's median round.
    systems = [s for s in args.systems if f"{s} {args.sizes[0]}" in results[0][1]]
    print(f"\n{args.nprocs} ranks, ringreduce transport {transport}: us per call (busbw GB/s)")
    print(f"{'size':>10}" + "".join(f"{s:>24}" for s in systems))
    factor = 2 * (args.nprocs - 1) / args.nprocs
    gbs: Dict[str, float] = {}
    for nbytes in args.sizes:
        cells = []
        for name in systems:
            t = max(statistics.median(r[f"{name} {nbytes}"]) for _, r in results)
            gbs[f"{name} {nbytes}"] = nbytes * (1 if name in COPIES else factor) / t / 1e9
            cells.append(f"{t * 1e6:>14.1f} ({gbs[f'{name} {nbytes}']:6.2f})")
        print(f"{nbytes:>10}" + "".join(f"{c:>24}" for c in cells))
    if any(name in COPIES for name in systems):
        print(f"{'':>10} (the copies' columns: bytes / time, not busbw)")
    for nbytes in args.sizes:
        for ours, copy in (("ours window", "d2d copy"), ("ours device", "h2d copy")):
            if f"{ours} {nbytes}" in gbs and f"{copy} {nbytes}" in gbs:
                ratio = gbs[f"{ours} {nbytes}"] / gbs[f"{copy} {nbytes}"]
                print(f"{nbytes:>10} {ours} busbw / {copy} bandwidth: {100 * ratio:.1f}%")
    return 0


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("--transports", default="tcp,shm")
    parser.add_argument("--sizes", default="64K,1M,16M,256M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma list of " + ", ".join(SYSTEMS)
    )
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    status = 0
    transports = args.transports.split(",")
    for spec in transports:
        split_transport(spec)  # a bad setting fails before any rank starts
    for spec in transports:
        status |= run_transport(args, spec)
    return status


if __name__ == "__main__":
    sys.exit(main())
