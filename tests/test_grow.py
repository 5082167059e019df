"""Newcomers join a running job: ``comm.grow(world_size)`` on the members, ``rr.join()``
in new processes. Members keep their ranks and newcomers take the next ones, the grown
communicator computes right, ``share_state`` hands the members' state to newcomers bit
for bit, a newcomer with the wrong token is refused without disturbing anyone, a
newcomer that dies while joining fails the grow (naming it) and leaves the members'
communicator working, and a job that lost a rank shrinks and grows back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _ranks import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "_grow_rank.py")
_LINKS = {"tcp": ("tcp", 0), "shm": ("shm", 0), "shm+tcp": ("auto", 2)}
TOKEN = "grow-test-token"


def _start(role, rank, size, port, links, scenario, token=TOKEN, die=False):
    transport, hosts = _LINKS[links]
    env = dict(os.environ, GROW_TEST_DIE="1" if die else "0")
    return subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            role,
            str(rank),
            str(size),
            str(port),
            transport,
            str(hosts),
            scenario,
            token,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(procs, timeout=90):
    """{name: report} of every process that printed one; fails on any other exit than a
    SIGKILL (the ranks that die on purpose)."""
    reports, errors = {}, []
    try:
        for name, p in procs.items():
            out, err = p.communicate(timeout=timeout)
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if lines:
                reports[name] = lines[-1]
            elif p.returncode != -9:
                errors.append(f"--- {name} (exit {p.returncode}):\n{err[-3000:]}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not errors, "\n".join(errors)
    return reports


@pytest.mark.parametrize("links", ["tcp", "shm", "shm+tcp"])
def test_members_grow_and_newcomers_get_the_state(links):
    n, grown = 2, 4
    port = free_port()
    scenario = f"grow={grown}"
    procs = {f"m{r}": _start("member", r, n, port, links, scenario) for r in range(n)}
    # The wrong newcomer goes first, alone: the members' lobby stays open until the
    # right newcomers have taken their seats, so it is there for the wrong one to be
    # refused by (started together, a slow wrong one could find it already closed).
    try:
        wrong = _finish(
            {"wrong": _start("newcomer", 0, grown, port, links, scenario, token="wrong")}
        )
    except BaseException:
        for p in procs.values():
            p.kill()
            p.wait()
        raise
    assert wrong["wrong"]["newcomer"] == "refused", wrong
    for k in range(grown - n):
        procs[f"n{k}"] = _start("newcomer", n + k, grown, port, links, scenario)
    reports = _finish(procs)
    for r in range(n):
        m = reports[f"m{r}"]
        assert m == {**m, "rank": r, "size": grown, "ok": True, "state": True, "old_ok": True}
    newcomer_ranks = sorted(reports[f"n{k}"]["newcomer"] for k in range(grown - n))
    assert newcomer_ranks == list(range(n, grown)), reports
    for k in range(grown - n):
        got = reports[f"n{k}"]
        assert got["size"] == grown and got["ok"] and got["state"], got


@pytest.mark.parametrize("links, victim", [("tcp", 0), ("shm", 1)])
def test_a_job_that_lost_a_rank_shrinks_and_grows_back(links, victim):
    n = 3
    port = free_port()
    scenario = f"shrink={victim},grow={n}"
    procs = {f"m{r}": _start("member", r, n, port, links, scenario) for r in range(n)}
    procs["n0"] = _start("newcomer", n - 1, n, port, links, scenario)
    reports = _finish(procs)
    survivors = [r for r in range(n) if r != victim]
    assert sorted(k for k in reports if k.startswith("m")) == [f"m{r}" for r in survivors]
    for new_rank, r in enumerate(survivors):
        m = reports[f"m{r}"]
        assert m["shrunk"] == n - 1 and m["rank"] == new_rank, m
        assert m["size"] == n and m["ok"] and m["state"] and m["old_ok"], m
    assert reports["n0"]["newcomer"] == n - 1 and reports["n0"]["state"], reports["n0"]


@pytest.mark.parametrize("links", ["shm", "tcp"])
def test_bucketers_adopt_the_grown_communicator_with_the_newcomers(links):
    """After a grow the members' bucketers adopt the grown communicator and the
    newcomers make theirs on it: the plan is checked there, buckets in windows are
    allocated again on every rank together, and a step reduces over everyone."""
    n, grown = 2, 3
    port = free_port()
    scenario = f"buckets,grow={grown}"
    procs = {f"m{r}": _start("member", r, n, port, links, scenario) for r in range(n)}
    procs.update(
        {f"n{r}": _start("newcomer", r, grown, port, links, scenario) for r in range(n, grown)}
    )
    reports = _finish(procs)
    assert len(reports) == grown, reports
    windows = links == "shm"
    for name, report in reports.items():
        assert report["ok"] and report["state"], report
        assert report["after"]["mean"], report
        # Only the 20 KB bucket is above the window path's small-call size.
        assert report["after"]["windows"] == (1 if windows else 0), report
        if name.startswith("m"):
            assert report["before"] == {"mean": True, "windows": 1 if windows else 0}, report
            assert report["generation"] == (1 if windows else 0), report
        else:
            assert report["generation"] == 0, report


def test_a_newcomer_that_dies_while_joining_fails_the_grow_and_nothing_else():
    n = 2
    port = free_port()
    scenario = f"seat-then-die,grow={n + 1}"
    procs = {f"m{r}": _start("member", r, n, port, "tcp", scenario) for r in range(n)}
    dying = _start("newcomer", n, n + 1, port, "tcp", scenario, die=True)
    dying.communicate(timeout=60)
    assert dying.returncode == -9  # it took its seat, then died
    procs["n0"] = _start("newcomer", n, n + 1, port, "tcp", scenario)
    reports = _finish(procs)
    for r in range(n):
        m = reports[f"m{r}"]
        # Named at once (its standby store is gone), not at the members' 6 s timeout.
        assert "rank 2" in m["first"] and "is gone" in m["first"], m
        assert m["first_s"] < 5, m
        assert m["old_ok"] and m["ok"] and m["state"] and m["size"] == n + 1, m
    assert reports["n0"]["newcomer"] == n and reports["n0"]["ok"], reports


def test_grow_refuses_what_it_cannot_do(tmp_path):
    import numpy as np

    import ringreduce as rr

    comm = rr.init("tcp", rank=0, world_size=1, store_dir=str(tmp_path), timeout=5)
    try:
        with pytest.raises(ValueError, match="already has 1 ranks"):
            comm.grow(1)
        with pytest.raises(rr.RingReduceError, match="store directory or MPI"):
            comm.grow(2)
        with pytest.raises(ValueError, match="no rank passed a state"):
            comm.share_state(None)
        state = comm.share_state({"x": np.arange(3.0)})
        assert np.array_equal(state["x"], np.arange(3.0))
    finally:
        comm.close()
