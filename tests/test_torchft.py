"""torchft on ringreduce (ringreduce.torchft): a replica group killed mid-step, restarted,
healed from the live one, and the two end with the same weights, to the bit; and the
adapter's contract with torchft's Manager, in one process (the last test).

A torchft Lighthouse runs in this process; examples/torchft_ddp.py is each replica
group (one process, so the all-reduce between the groups is all that ringreduce
carries). Group 1 SIGKILLs itself in the middle of step K's backward, once step K's
quorum has formed: group 0 is inside step K's all-reduce, which must fail at once
(not time out), and torchft must drop that step. Group 1 is started again and heals:
torchft's PGTransport sends it group 0's weights and optimizer state over
ringreduce's point-to-point messages. The Lighthouse asks for 2 groups, so group 0
waits for the restarted one instead of training on alone, and every count is exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

pytest.importorskip("torch", reason="needs torch: pip install torch (the CPU wheel is enough)")
pytest.importorskip("torchft", reason="needs torchft: pip install torchft==0.2.0")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torchft.coordination import LighthouseServer  # noqa: E402

from ringreduce.torchft import ProcessGroupRingReduceFT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "torchft_ddp.py")
STEPS, FAIL_AT = 20, 8
DEADLINE = 90.0  # seconds for the whole run; it takes about 15 here, on 2 cores


def _start(group: int, out, lighthouse: str, save: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(REPLICA_GROUP_ID=str(group), TORCHFT_LIGHTHOUSE=lighthouse)
    cmd = [
        sys.executable,
        EXAMPLE,
        "--steps",
        str(STEPS),
        "--timeout",
        "30",
        "--save",
        save,
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait(proc: subprocess.Popen, deadline: float, log: str) -> int:
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running at the deadline:\n{_tail(log)}") from None


def _tail(path: str, n: int = 6000) -> str:
    with open(path, errors="replace") as f:
        return f"--- {os.path.basename(path)} ---\n" + f.read()[-n:]


def test_replica_killed_mid_step_heals_to_identical_weights(tmp_path):
    lighthouse = LighthouseServer(
        bind="[::]:0",
        min_replicas=2,
        join_timeout_ms=10_000,
        quorum_tick_ms=20,
        heartbeat_timeout_ms=500,
    )
    logs = {name: str(tmp_path / f"{name}.log") for name in ("group0", "group1", "group1-again")}
    procs = []
    deadline = time.monotonic() + DEADLINE
    try:
        with open(logs["group0"], "w") as g0, open(logs["group1"], "w") as g1:
            procs.append(_start(0, g0, lighthouse.address(), str(tmp_path)))
            procs.append(
                _start(1, g1, lighthouse.address(), str(tmp_path), "--fail-at-step", str(FAIL_AT))
            )
        code = _wait(procs[1], deadline, logs["group1"])
        died = time.time()
        assert code == -signal.SIGKILL, f"group 1 exited with {code}\n{_tail(logs['group1'])}"
        with open(logs["group1-again"], "w") as again:
            restarted = time.time()
            procs.append(_start(1, again, lighthouse.address(), str(tmp_path)))
        for proc, log in ((procs[0], logs["group0"]), (procs[2], logs["group1-again"])):
            code = _wait(proc, deadline, log)
            assert code == 0, f"exit code {code}\n{_tail(log)}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        lighthouse.shutdown()

    every_log = "\n".join(_tail(log) for log in logs.values())
    with open(logs["group0"], errors="replace") as f:
        survivor_log = f.read()
    # Group 0 learnt of the death from ringreduce, at once, and torchft dropped the step.
    assert "a collective failed, torchft will drop this step" in survivor_log, every_log
    assert "exited, crashed or was killed" in survivor_log, every_log
    assert "Timed out" not in survivor_log, every_log

    with open(tmp_path / "group0.json") as f:
        survivor = json.load(f)
    with open(tmp_path / "group1.json") as f:  # written by the restarted group 1
        healed = json.load(f)
    # Every step from 0 to STEPS committed once on group 0; only step K was tried twice.
    assert survivor["step"] == STEPS and survivor["committed"] == STEPS, survivor
    assert survivor["tried"] == STEPS + 1 and survivor["healed"] is None, survivor
    assert [d["step"] for d in survivor["dropped"]] == [FAIL_AT], survivor
    noticed = survivor["dropped"][0]["at"] - died  # after the should_commit round trip
    assert noticed < 5, f"group 0 dropped step {FAIL_AT} {noticed:.2f} s after the kill"
    # The restarted group 1 joined at step K, with group 0's state, and trained to the end.
    assert healed["healed"] is not None and healed["healed"]["step"] == FAIL_AT, healed
    assert healed["step"] == STEPS and healed["committed"] == STEPS - FAIL_AT, healed
    assert healed["tried"] == STEPS - FAIL_AT and not healed["dropped"], healed
    seconds = healed["healed"]["at"] - died
    assert 0 < seconds < 30, f"healed {seconds:.1f} s after group 1 died"

    # Identical weights, to the bit, and not the ones either group started with.
    assert survivor["sha256"] == healed["sha256"], (survivor, healed)
    mine = torch.load(tmp_path / "group0.pt")
    theirs = torch.load(tmp_path / "group1.pt")
    assert list(mine) == list(theirs) and mine
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), f"{name} differs"
    torch.manual_seed(0)  # group 0's initial weights (examples/torchft_ddp.py)
    first = torch.nn.Linear(2, 64)
    assert not torch.equal(first.weight.detach(), mine["0.weight"]), "no step was applied"
    print(
        f"group 0 dropped step {FAIL_AT} {noticed:.3f} s after group 1 was killed; group 1 "
        f"healed {seconds:.2f} s after it was killed: {healed['started'] - restarted:.2f} s "
        f"to start python and import torch and torchft, "
        f"{healed['healed']['at'] - healed['started']:.2f} s from there to its first step, "
        f"healed; weights identical"
    )


# ---- the adapter's contract with torchft's Manager, in one process -------------------


def _configure(pgs: list, store: dist.TCPStore, quorum: int) -> None:
    """What the Managers of two replica groups do on a new quorum, on two threads."""
    addr = f"localhost:{store.port}/torchft/{quorum}/0"
    threads = [
        threading.Thread(target=pg.configure, args=(addr, f"replica{r}", r, len(pgs)))
        for r, pg in enumerate(pgs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "configure() did not return in 30 s"


def _allreduce(pgs: list) -> list:
    tensors = [torch.full((5,), float(r + 1)) for r in range(len(pgs))]
    works = [pg.allreduce([t], dist.AllreduceOptions()) for pg, t in zip(pgs, tensors)]
    assert all(w.wait() for w in works)
    return tensors


def test_a_failed_collective_is_reported_through_errored_and_a_new_quorum_clears_it():
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pgs = [ProcessGroupRingReduceFT(timeout=timedelta(seconds=20)) for _ in range(2)]
    try:
        _configure(pgs, store, quorum=1)
        assert pgs[0].getBackendName() == "torchft-ringreduce" and pgs[0].size() == 2
        assert all(torch.equal(t, torch.full((5,), 3.0)) for t in _allreduce(pgs))
        assert [pg.errored() for pg in pgs] == [None, None]

        # Replica 1 is gone (torchft aborts its group) while replica 0 waits for it: the
        # wait returns (torchft's DDP hook cannot take an exception there), promptly,
        # and errored() says why, so that the Manager drops the step.
        work = pgs[0].allreduce([torch.ones(5)], dist.AllreduceOptions())
        started = time.monotonic()
        pgs[1].abort()
        assert work.wait() is True
        assert time.monotonic() - started < 5
        assert "rank 1" in str(pgs[0].errored()), repr(pgs[0].errored())
        assert "aborted" in str(pgs[1].errored()), repr(pgs[1].errored())

        # The next quorum makes a new group under a new prefix: no error, sums again.
        _configure(pgs, store, quorum=2)
        assert [pg.errored() for pg in pgs] == [None, None]
        assert all(torch.equal(t, torch.full((5,), 3.0)) for t in _allreduce(pgs))

        # Point-to-point (torchft's checkpoint transport) raises, as torchft expects.
        recv = pgs[0].recv([torch.zeros(3)], 1, 5)
        pgs[1].abort(errored=False)
        with pytest.raises(Exception, match="rank 1"):
            recv.wait()
        assert pgs[1].errored() is None  # a reconfiguration, not a failure
    finally:
        for pg in pgs:
            pg.shutdown()
