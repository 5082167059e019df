"""Multi-process launcher: ``ringreduce launch -n N -- prog args...``.

Starts N copies of a program on this machine, one per rank, with the environment that
``ringreduce.init()`` (and ``torch.distributed``'s ``env://``) reads: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. On several machines, run it
once per machine with torchrun's options (``--nnodes 2 --node-rank 0 --master-addr HOST
--nproc-per-node 4``). Every output line of a rank is prefixed with ``"[rank] "`` (stdout
stays on stdout, stderr on stderr). When one rank fails, the others are stopped (SIGTERM,
then SIGKILL after a grace period) and the launcher exits with the failing rank's code, so
a broken job never leaves orphans or hangs. Ctrl-C stops every rank and prints one line.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build_parser", "free_port", "launch", "main"]

# Where each name lives. They load on first use: every rank imports `ports` (through the
# communicator's start-up) and should not pay for the launcher's argparse and subprocess.
_HOMES = {"build_parser": "cli", "main": "cli", "free_port": "ports", "launch": "run"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(__all__)
