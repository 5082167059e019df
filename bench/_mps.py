"""CUDA MPS for a benchmark's own processes, so that ranks sharing one GPU can be timed
with their work sent to one server (nothing time-sliced) as well as without.

`mps_daemon()` starts a control daemon of its own, whose pipe and log directory is a
fresh temporary one, and stops it on the way out: only processes started with the
environment it yields (CUDA_MPS_PIPE_DIRECTORY) become its clients, so nothing else on
the machine, before, during or after, runs under it. The GPU's settings are left as
they are. A SIGTERM meanwhile (gpu_check.sh's `timeout`) exits through the same way
out, so a step killed for time does not leave its daemon behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Dict, Iterator, Optional, Tuple

CONTROL = "nvidia-cuda-mps-control"


@contextlib.contextmanager
def mps_daemon() -> Iterator[Tuple[Optional[Dict[str, str]], str]]:
    """Yields (env, "") with the daemon running, env being what its clients need; or
    (None, why) where it cannot run (no control program, or the daemon did not start)."""
    control = shutil.which(CONTROL)
    if control is None:
        yield None, f"{CONTROL} is not on PATH"
        return
    with tempfile.TemporaryDirectory(prefix="rr-mps-") as d:
        env = {"CUDA_MPS_PIPE_DIRECTORY": d, "CUDA_MPS_LOG_DIRECTORY": d}
        full = dict(os.environ, **env)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
        try:
            started = subprocess.run([control, "-d"], env=full, capture_output=True, timeout=20)
            if started.returncode != 0:
                why = (started.stderr or started.stdout).decode(errors="replace").strip()
                yield None, f"the MPS daemon did not start (status {started.returncode}: {why})"
                return
            yield env, ""
        finally:
            # The control daemon takes commands on stdin; "quit" stops it and its server
            # (and does nothing where none started).
            subprocess.run([control], input=b"quit\n", env=full, capture_output=True, timeout=20)
            if main:
                signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def environment(env: Dict[str, str]) -> Iterator[None]:
    """`env` set in os.environ meanwhile (the processes started inside inherit it, such
    as mps_daemon()'s clients), and the environment as it was afterwards."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
