"""GradientBucketer(fault_tolerant=True): a rank dies in the middle of a step's
all-reduces (after the first bucket was reduced with it); the survivors' step still
finishes, with the average over the survivors alone, equal to a clean computation that
drops the dead rank's micro-batch for that step (1e-12 in float64), and the next steps
average over the survivors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _ranks import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "_ft_bucket_rank.py")
sys.path.insert(0, os.path.dirname(__file__))
from _ft_bucket_rank import SHAPES  # noqa: E402


def expected(ranks: list, step: int) -> list:
    return [
        np.mean([np.full(s, 1.0 + r + 10 * step + i) for r in ranks], axis=0)
        for i, s in enumerate(SHAPES)
    ]


@pytest.mark.parametrize(
    "transport, dtype, tol",
    [("tcp", "float64", 1e-12), ("shm", "float64", 1e-12), ("tcp", "float16", 2e-3)],
)
def test_a_step_that_loses_a_rank_finishes_with_the_survivors_average(transport, dtype, tol):
    n, victim, steps = 4, 2, 3
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                SCRIPT,
                str(r),
                str(n),
                port,
                transport,
                str(victim),
                str(steps),
                dtype,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(n)
    ]
    reports = {}
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            if r == victim:
                assert p.returncode == -9, err[-2000:]
                continue
            assert p.returncode == 0, err[-3000:]
            reports[r] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors
    for report in reports.values():
        assert len(report["plan"]) == 4, report["plan"]  # one bucket per parameter
        assert report["changes"] == [3], report
        for step, got in enumerate(report["steps"]):
            ranks = list(range(n)) if step == 0 else survivors
            assert got["world"] == len(ranks)
            for g, want in zip(got["grads"], expected(ranks, step)):
                np.testing.assert_allclose(np.asarray(g).reshape(want.shape), want, rtol=tol)
    # Replicas identical, bit for bit.
    first = reports[survivors[0]]["steps"]
    assert all(reports[r]["steps"] == first for r in survivors)
