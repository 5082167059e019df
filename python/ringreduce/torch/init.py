"""``rr.torch.init_process_group()``: torch.distributed's default group from whichever
launcher started this process.

torch's own ``env://`` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
torchrun and ``ringreduce launch`` set and mpirun and srun do not: under those a script
either fails to meet or, with run-alone defaults, trains alone in every process. Here
rank and world size come from the same variables ``rr.init()`` reads (``_env``), and the
store the ranks meet through is placed as ``rr.init()`` places its own: at MASTER_ADDR
when it is set, at an address and free port that rank 0 picks and MPI hands to every
rank under mpirun, and nowhere at all for a world of one.
"""

from __future__ import annotations

import datetime
from typing import Tuple, Union

import torch.distributed as dist

from .. import _env
from .._comm import mpi

__all__ = ["init_process_group"]

# torch.distributed's own default for CPU backends.
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
_DEFAULT_PORT = 29500


def _timedelta(timeout: Union[None, float, datetime.timedelta]) -> datetime.timedelta:
    if timeout is None:
        return _DEFAULT_TIMEOUT
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return datetime.timedelta(seconds=seconds)


def _store_address(timeout: datetime.timedelta) -> Tuple[str, int]:
    """(host, port) where rank 0 hosts the store."""
    given = _env.master_addr()
    if not given and _env.launched_by_mpirun() and mpi.have_mpi4py():
        from mpi4py import MPI

        host, port, _ = mpi.tcp_rendezvous(MPI.COMM_WORLD, timeout.total_seconds())
        return host, port
    # torch's store listens on MASTER_PORT itself (RINGREDUCE_PORT is rr.init()'s). Without
    # MASTER_ADDR: loopback, refused where the launcher says the ranks span hosts.
    return _env.master_address(given or None, _env.master_port(_DEFAULT_PORT))


def init_process_group(
    backend: str = "ringreduce",
    *,
    timeout: Union[None, float, datetime.timedelta] = None,
) -> None:
    """Initialises torch.distributed's default process group from any launcher
    ringreduce knows: ``ringreduce launch``, torchrun, mpirun/mpiexec (Open MPI, MPICH,
    Intel MPI), srun, or none (a world of one).

    With RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT all set (``ringreduce launch``,
    torchrun) it is ``torch.distributed.init_process_group(backend)`` over ``env://``.
    Otherwise rank and world size come from OMPI_COMM_WORLD_*, PMI_* or SLURM_* (as for
    ``rr.init()``), and the ranks meet through a ``TCPStore``: at MASTER_ADDR:MASTER_PORT
    when MASTER_ADDR is set; under mpirun with mpi4py installed, at an address and free
    port rank 0 picks and MPI hands to the others; else on 127.0.0.1:MASTER_PORT
    (default 29500), which serves the ranks of one host only (ValueError where the
    launcher says they span hosts). A world of one needs no store and no port.

    It then sets RANK, WORLD_SIZE and LOCAL_RANK (and LOCAL_WORLD_SIZE where known) in
    ``os.environ`` where they were not set, as torchrun would have: trainers such as
    Accelerate and Lightning read them to see a multi-process run.

    Args:
        backend: "ringreduce" (default), or another backend to compare with ("gloo").
        timeout: seconds or a ``timedelta`` for the store and the group (default: 30 min,
            torch's default).

    Raises:
        RuntimeError: the default group is already initialised.
        ValueError: an inconsistent launcher environment (named in the message).
    """
    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed's default process group is already initialised; call "
            "init_process_group() once (torch.distributed.destroy_process_group() ends it)"
        )
    delta = _timedelta(timeout)
    env_init = _env.torch_env_init_ready()
    rank, size = _env.rank_and_size(None, None)
    if env_init:
        dist.init_process_group(backend, init_method="env://", timeout=delta)
    elif size == 1:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=delta
        )
    else:
        host, port = _store_address(delta)
        store = dist.TCPStore(
            host, port, size, is_master=rank == 0, timeout=delta, wait_for_workers=False
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=delta)
    _env.export_launch(rank, size, *_env.local_rank_and_size(rank, size))
