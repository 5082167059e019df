"""``dist.shrink_group`` on the "ringreduce" backend: after a rank is killed (SIGKILL),
every survivor's collective raises a clean error (no SIGABRT, no hang), the survivors
shrink the default group (also when the dead rank hosted torch's store), collectives on
the new group equal numpy's, the old group's calls and ``abort()`` fail cleanly, and DDP
trains on over the new group, matching a one-process run that drops the dead rank's
micro-batches. ``examples/torch_elastic_ddp.py`` runs as it is documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip(
    "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "_torch_shrink_rank.py")
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "torch_elastic_ddp.py")


def run_job(n: int, links: str, victim: int, scenario: str, timeout: float = 120) -> dict:
    """{rank: report} of the survivors; the victim must have died of its SIGKILL and
    every survivor must have exited 0 (a SIGABRT or a crash fails the test)."""
    done = subprocess.run(
        [sys.executable, SCRIPT, str(n), links, str(victim), scenario],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    job = json.loads(lines[-1])
    want = [-9 if r == victim else 0 for r in range(n)]
    assert job["exit"] == want, (job, done.stderr[-5000:])
    reports = {int(r): report for r, report in job["reports"].items()}
    assert sorted(reports) == [r for r in range(n) if r != victim], job
    return reports


@pytest.mark.parametrize(
    "links, n, victim",
    [("tcp", 4, 2), ("shm", 3, 0)],  # shm, rank 0: the host of torch's store died
)
def test_shrink_group_after_a_killed_rank(links, n, victim):
    reports = run_job(n, links, victim, "collective")
    survivors = [r for r in range(n) if r != victim]
    for old, seen in reports.items():
        assert seen["transport"] == links, seen
        # The old group: revoked, PeerError now and at once on the next call.
        assert seen["error"] == "PeerError" and seen["revoked"], seen
        assert seen["again"][0] == "PeerError" and seen["again"][1] < 0.5, seen
        # The new default group: renumbered in the old order, still "ringreduce".
        assert seen["default"] and seen["type"] == "ProcessGroupRingReduce", seen
        assert (seen["rank"], seen["size"]) == (survivors.index(old), n - 1), seen
        assert seen["backend"] == "ringreduce", seen
        assert seen["sum_ok"] and seen["gathered"] == survivors, seen
        assert seen["bcast"] == float(survivors[0]), seen
        # The destroyed old group: a clean error; abort() did not kill the process.
        assert seen["old"] == "PeerError", seen
        assert seen["shrink_s"] < 10, seen


def test_ddp_goes_on_over_the_shrunk_group():
    reports = run_job(3, "tcp", 1, "ddp")
    for seen in reports.values():
        # The failed step raised (RuntimeError from backward(), no crash), was redone
        # among the survivors, and training finished on 2 identical replicas that equal
        # the one-process run without the dead rank's micro-batches from that step on.
        assert seen["errors"] == [[3, "RuntimeError"]], seen
        assert seen["size"] == 2 and seen["identical"], seen
        assert seen["vs_reference"] < 1e-12, seen


def test_the_example_runs():
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    done = subprocess.run(
        [sys.executable, EXAMPLE], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "replicas identical on 3 survivors" in done.stdout, done.stdout
