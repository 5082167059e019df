"""Over MPI, a rank whose process ends is named by the others within seconds (the
liveness connections of common/liveness.h), not at their timeout."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from _mpi_support import mpirun_env, needs_mpi_transport, outside

pytestmark = [outside, needs_mpi_transport]

_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import ringreduce as rr

    comm = rr.init("mpi", timeout=60)
    x = np.ones(1 << 14, dtype=np.float32)
    victim = comm.world_size - 1
    start = time.monotonic()
    try:
        while True:
            if comm.rank == victim and time.monotonic() - start > 0.5:
                print(f"VICTIM at={time.time():.3f}", flush=True)
                if sys.argv[1] == "kill":
                    os.kill(os.getpid(), 9)
                os._exit(3)  # as after an uncaught exception, without closing anything
            comm.all_reduce(x, out=x)
            x[:] = 1
    except rr.RingReduceError as exc:
        print(f"RESULT rank={comm.rank} kind={type(exc).__name__} peer={exc.peer} "
              f"at={time.time():.3f} :: {exc}", flush=True)
        # MPI_Finalize waits for the dead rank forever (no ULFM here): leave without it.
        os._exit(0)
    """
)


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_rank_that_ends_is_named_within_seconds(tmp_path, how):
    script = tmp_path / "die.py"
    script.write_text(_SCRIPT)
    n = 3
    proc = subprocess.run(
        # --enable-recovery and error_non_zero_exit=0: prterun leaves the survivors
        # running when a rank dies or exits non-zero. By default it kills the job
        # as soon as it notices, which can be before the survivors have noticed
        # themselves: that race is the launcher's, not what this test is about.
        ["mpirun", "--enable-recovery", "-np", str(n), sys.executable, str(script), how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**mpirun_env(), "PRTE_MCA_state_base_error_non_zero_exit": "0"},
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout
    victim = re.search(r"VICTIM at=([\d.]+)", out)
    assert victim, out + proc.stderr
    results = re.findall(r"RESULT rank=(\d+) kind=(\w+) peer=(\S+) at=([\d.]+) :: (.*)", out)
    # Every survivor reports, naming the right rank, promptly.
    assert sorted(int(r[0]) for r in results) == list(range(n - 1)), out + proc.stderr
    for _rank, kind, peer, at, message in results:
        assert kind == "PeerError", message
        assert peer == str(n - 1), message
        assert float(at) - float(victim.group(1)) < 5, message
        # kill -9 sends no goodbye; the exit either way ends every connection.
        assert "process ended" in message or (how == "exit" and "left" in message), message
