"""Ranks of a torch.distributed job for the tests: each runs a function inside an
initialised process group and sends back its result (numpy for tensors)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
import traceback

import torch

from _ranks import free_port


def _context():
    """Rank processes are forks of a server that has imported torch, ringreduce and this
    module once (forkserver), not fresh interpreters that import torch each time (spawn:
    about 2 s of CPU per rank, in every test). The server forks before any process
    group (and so any engine or torch thread) exists in it; each rank takes the test's
    environment as it is when the rank starts (`_rank_main`)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "torch", "ringreduce", "ringreduce.torch", "_torch_ranks"])
    return ctx


_CTX = _context()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rank_main(rank, n, backend, init, timeout_s, conn, fn, args, env):
    os.environ.clear()
    os.environ.update(env)  # the test's environment, not the fork server's
    import torch.distributed as dist

    import ringreduce.torch  # noqa: F401 (registers the backend)

    try:
        kind, where = init
        kwargs = dict(rank=rank, world_size=n, timeout=datetime.timedelta(seconds=timeout_s))
        if kind == "env":
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(where))
            kwargs["init_method"] = "env://"
        elif kind == "tcp":
            kwargs["init_method"] = f"tcp://127.0.0.1:{where}"
        elif kind == "file":
            kwargs["init_method"] = f"file://{where}"
        else:  # a store made by the caller
            store = dist.TCPStore("127.0.0.1", where, n, rank == 0, timeout=kwargs["timeout"])
            kwargs["store"] = store
        dist.init_process_group(backend, **kwargs)
        result = _plain(fn(rank, n, *args))
        dist.destroy_process_group()
        conn.send(("ok", result, ""))
    except BaseException as exc:  # report, don't hang the parent
        try:
            conn.send(("err", repr(exc), traceback.format_exc()))
        except Exception:
            pass


def _plain(value):
    """Tensors as numpy arrays: a torch tensor sent through a pipe lives in shared memory
    that goes away with the rank."""
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def run(n, fn, *args, backend="ringreduce", init="env", timeout_s=60.0, tmp=None, wait=240):
    """Runs fn(rank, n, *args) on n spawned ranks inside an initialised process group;
    returns the per-rank results (raises with every failing rank's traceback)."""
    where = free_port() if init in ("env", "tcp", "store") else os.path.join(tmp, "rendezvous")
    procs, conns = [], []
    for rank in range(n):
        parent, child = _CTX.Pipe()
        p = _CTX.Process(
            target=_rank_main,
            args=(rank, n, backend, (init, where), timeout_s, child, fn, args, dict(os.environ)),
            daemon=True,
        )
        p.start()
        procs.append(p)
        conns.append(parent)
    deadline = time.monotonic() + wait
    outcomes = []
    for rank, conn in enumerate(conns):
        if conn.poll(max(0.0, deadline - time.monotonic())):
            try:
                outcomes.append(conn.recv())
            except EOFError:
                outcomes.append(("dead", None, f"rank {rank} exited"))
        else:
            outcomes.append(("hung", None, f"rank {rank} gave no answer in {wait} s"))
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    bad = [(r, o) for r, o in enumerate(outcomes) if o[0] != "ok"]
    if bad:
        raise AssertionError("\n".join(f"--- rank {r} ({o[0]}): {o[1]}\n{o[2]}" for r, o in bad))
    return [o[1] for o in outcomes]
