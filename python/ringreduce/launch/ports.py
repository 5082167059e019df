"""Free ports for a job's rendezvous: torch.distributed's store and ringreduce's."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(addr: str = "127.0.0.1", span: int = 2) -> int:
    """Returns a port p on ``addr`` such that p .. p+span-1 were all free a moment ago.

    ``span`` defaults to 2 because a launched job uses two: torch.distributed's env://
    store listens on MASTER_PORT, ringreduce's rendezvous on RINGREDUCE_PORT (the next).
    """
    for _ in range(64):
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port + span - 1 > 65535:
            continue
        if all(_port_is_free(addr, port + k) for k in range(1, span)):
            return port
    raise OSError(f"no run of {span} free ports found on {addr}")


def _port_is_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True
