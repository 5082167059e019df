"""Under mpirun, the survivors of a dead rank shrink onto the job's own shared-memory
and TCP links: a standard MPI communicator cannot go on with a dead rank (ringreduce
does not use ULFM), but every communicator ``init`` makes over MPI also serves standby
stores."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from _mpi_support import mpirun_env, needs_mpi_transport, outside

pytestmark = [outside, needs_mpi_transport]

_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    import ringreduce as rr

    comm = rr.init(sys.argv[1], timeout=20)
    victim = int(sys.argv[2])
    report = {"rank": comm.rank, "transport": comm.transport}
    x = np.ones(1 << 14, dtype=np.float32)
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            if comm.rank == victim and time.monotonic() - start > 0.3:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.all_reduce(x, out=x)
            x[:] = 1
    except rr.PeerError as exc:
        report.update(peer=exc.peer, failed=sorted(exc.failed), revoked=comm.revoked)
        new = comm.shrink()
        got = new.all_reduce(np.full(1000, new.rank + 1.0))
        report.update(new_rank=new.rank, size=new.world_size, links=new.transport,
                      ok=bool(np.all(got == new.world_size * (new.world_size + 1) / 2)))
        new.close()
    print("REPORT " + json.dumps(report), flush=True)
    os._exit(0)  # MPI_Finalize would wait for the dead rank forever
    """
)


@pytest.mark.parametrize("transport, victim", [("mpi", 0), ("auto", 1)])
def test_survivors_shrink_onto_their_own_links(tmp_path, transport, victim):
    script = tmp_path / "shrink.py"
    script.write_text(_SCRIPT)
    n = 3
    proc = subprocess.run(
        # --enable-recovery and error_non_zero_exit=0: prterun leaves the survivors
        # running when a rank dies (by default it kills the whole job).
        [
            "mpirun",
            "--enable-recovery",
            "-np",
            str(n),
            sys.executable,
            str(script),
            transport,
            str(victim),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**mpirun_env(), "PRTE_MCA_state_base_error_non_zero_exit": "0"},
    )
    reports = [
        json.loads(line[len("REPORT ") :])
        for line in proc.stdout.splitlines()
        if line.startswith("REPORT ")
    ]
    survivors = [r for r in range(n) if r != victim]
    assert sorted(r["rank"] for r in reports) == survivors, proc.stdout + proc.stderr[-3000:]
    for r in reports:
        assert r["peer"] == victim and r["failed"] == [victim] and r["revoked"], r
        assert r["new_rank"] == survivors.index(r["rank"]) and r["size"] == n - 1, r
        assert r["links"] == "shm" and r["ok"], r
