"""Ranks on separate emulated hosts (network namespaces joined by a bridge).

These need root and iproute2; they are skipped elsewhere. They check what
loopback cannot: a rank advertises the address other hosts reach it at, and a
network partition (no FIN, no RST: packets just stop) ends in TimeoutError
naming the unreachable rank instead of a hang.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "_netns_rank.py")
PREFIX = f"rrt{os.getpid() % 100000}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    try:
        _ip("netns", "add", f"{PREFIX}probe")
        _ip("netns", "del", f"{PREFIX}probe")
        return True
    except (subprocess.CalledProcessError, OSError):
        return False


pytestmark = pytest.mark.skipif(
    not _can_make_namespaces(),
    reason="needs root and ip netns: run as root with iproute2 (apt-get install iproute2)",
)


@pytest.fixture
def hosts():
    """Three hosts, 10.232.0.1-3, on a bridge in its own namespace."""
    n = 3
    switch = f"{PREFIX}sw"
    names = [f"{PREFIX}h{i}" for i in range(n)]
    try:
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, ns in enumerate(names):
            _ip("netns", "add", ns)
            _ip(
                "link",
                "add",
                f"v{PREFIX}{i}",
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                f"p{i}",
                "netns",
                switch,
            )
            _ip("-n", ns, "addr", "add", f"10.232.0.{i + 1}/24", "dev", f"v{PREFIX}{i}")
            _ip("-n", ns, "link", "set", f"v{PREFIX}{i}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", switch, "link", "set", f"p{i}", "up")
        yield names, switch
    finally:
        for ns in names + [switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _start(names, mode, timeout="20", transport="tcp", keepalive=None):
    """One rank per entry of `names` (a namespace may appear several times)."""
    procs = []
    for rank, ns in enumerate(names):
        env = dict(os.environ)
        if keepalive is not None:
            env["RINGREDUCE_TCP_KEEPALIVE"] = keepalive
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(len(names)),
            MASTER_ADDR="10.232.0.1",
            MASTER_PORT="29400",
            RR_TEST_TIMEOUT=timeout,
            RR_TEST_TRANSPORT=transport,
        )
        env.pop("RINGREDUCE_HOST_ID", None)
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, SCRIPT, mode],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _last_json(proc, timeout):
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def test_all_reduce_across_hosts(hosts):
    names, _ = hosts
    results = [_last_json(p, 60) for p in _start(names, "reduce")]
    assert all(r.get("ok") for r in results), results
    # 2(N-1)/N of 12 MB per rank, plus headers: the bytes really crossed hosts.
    for r in results:
        assert abs(r["stats"]["bytes_sent"] - 4 / 3 * 3_000_017 * 4) < 1024


def test_auto_uses_shared_memory_inside_a_namespace_and_tcp_between(hosts):
    # Two ranks in each of two namespaces: the namespace is part of the host's
    # identity, so ranks share memory with their namespace's other rank only.
    names, _ = hosts
    placed = [names[0], names[0], names[1], names[1]]
    results = [_last_json(p, 60) for p in _start(placed, "reduce", transport="auto")]
    assert all(r.get("ok") for r in results), results
    assert [(r["transport"], r["local"]) for r in results] == [("shm+tcp", 2)] * 4


# Waits out a timeout across namespaces: in the extended run (CI runs it).
@pytest.mark.extended
def test_network_partition_times_out_naming_the_rank(hosts):
    names, switch = hosts
    procs = _start(names, "partition", timeout="3")
    # Wait until every rank is inside the loop, then cut host 2 off the bridge.
    for p in procs:
        assert json.loads(p.stdout.readline()).get("ready")
    time.sleep(0.3)
    _ip("-n", switch, "link", "set", "p2", "down")
    cut = time.monotonic()
    results = [_last_json(p, 60) for p in procs]
    elapsed = time.monotonic() - cut
    for r in results[:2]:
        assert r.get("error") in ("TimeoutError", "PeerError"), r
        assert r.get("peer") in (1, 2), r  # the rank waited on, or the cut-off one
    assert elapsed < 30, "every rank must give up within a few timeouts"


@pytest.mark.extended
def test_a_partitioned_host_is_named_at_the_keepalive_not_the_timeout(hosts):
    """A host cut off the network sends no FIN and no RST; with a 60 s timeout the
    survivors would wait that long. Keepalive probes (3 s here) name it sooner."""
    names, switch = hosts
    procs = _start(names, "partition", timeout="60", keepalive="3")
    for p in procs:
        assert json.loads(p.stdout.readline()).get("ready")
    time.sleep(0.3)
    _ip("-n", switch, "link", "set", "p2", "down")
    cut = time.monotonic()
    results = [_last_json(p, 90) for p in procs[:2]]
    elapsed = time.monotonic() - cut
    assert [r.get("error") for r in results] == ["PeerError"] * 2, results
    named = [r for r in results if r.get("peer") == 2 and "stopped answering" in r["message"]]
    assert named, results
    # Not a rank that died: one whose machine answered nothing, which the shrink's
    # agreement acts on. Each survivor saw it itself or read the first one's report.
    assert [r.get("reason") for r in results] == ["unreachable"] * 2, results
    assert elapsed < 20, f"the survivors gave up {elapsed:.1f} s after the cut"
    cut_off = _last_json(procs[2], 90)
    assert cut_off.get("error") == "PeerError", cut_off["message"]  # it lost both peers


_STANDBY_SERVER = """
import sys, time
from ringreduce import _core
s = _core.TcpStore("10.232.0.1", 0, True, 60, 30)
print(s.port, flush=True)
time.sleep(60)
"""
_STANDBY_CLIENT = """
import json, sys, time
from ringreduce import _core
c = _core.TcpStore("10.232.0.1", int(sys.argv[1]), False, 10, 30, "", int(sys.argv[2]))
c.set("in", b"1")
print(json.dumps({"ready": True}), flush=True)
start = None
try:
    while True:
        start = time.monotonic()
        c.wait_get("never", 1000)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc),
                      "after": time.monotonic() - start,
                      "unreachable": c.host_unreachable()}), flush=True)
"""


@pytest.mark.extended
def test_a_standby_store_client_names_its_cut_off_host_at_the_keepalive(hosts):
    """The survivors of a shrink meet on a standby store, as clients made with the
    job's keepalive (Membership._connect): a request to its host, cut off the network,
    fails at the keepalive and says the machine is unreachable. Without it the request
    waits out the store's I/O cap (30 s here) and names no reason."""
    names, switch = hosts
    netns = ["ip", "netns", "exec"]
    server = subprocess.Popen(
        [*netns, names[0], sys.executable, "-c", _STANDBY_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        port = server.stdout.readline().strip()
        client = subprocess.Popen(
            [*netns, names[1], sys.executable, "-c", _STANDBY_CLIENT, port, "2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(client.stdout.readline()).get("ready")
        time.sleep(0.3)
        _ip("-n", switch, "link", "set", "p0", "down")
        result = _last_json(client, 40)
    finally:
        server.kill()
        server.communicate()
    assert result.get("unreachable") is True, result
    assert result["after"] < 10, result


@pytest.mark.extended
@pytest.mark.parametrize("cut", [0, 2])
def test_only_the_majority_side_of_a_partition_goes_on(hosts, cut):
    """Host `cut` loses the bridge and stays up: its rank is alive, alone. Both sides
    shrink; the two survivors that still reach each other go on, and the cut-off rank,
    a minority, refuses rather than train on as a job of its own (split brain). Rank 0
    hosts the rendezvous store: cut off, it is the minority all the same."""
    names, switch = hosts
    procs = _start(names, "split", timeout="30", keepalive="2")
    for p in procs:
        assert json.loads(p.stdout.readline()).get("ready")
    time.sleep(0.3)
    _ip("-n", switch, "link", "set", f"p{cut}", "down")
    results = [_last_json(p, 90) for p in procs]
    others = [r for i, r in enumerate(results) if i != cut]
    assert [(r.get("shrunk"), r.get("shrunk_sum")) for r in others] == [(2, 2.0)] * 2, others
    alone = results[cut]
    assert alone.get("error") == "PeerError", alone
    assert alone.get("shrink_error") == "PeerError", json.dumps(alone)
    assert "no majority" in alone["shrink_message"], alone
    # Its peers' machines answer nothing: unreachable at the keepalive (2 s), whether
    # or not a link of its own named them, not silent until the agreement's timeout (8 s);
    # and the candidate hosts below it are waited out together, in one connect time,
    # counted as the silence the agreement it then hosts needs (2.2 s either way; rank
    # 2 took 4.4 s when it tried rank 0 for 2 s first, then waited 2 s as host).
    assert alone["shrink_s"] < 3.5, alone


@pytest.mark.extended
@pytest.mark.parametrize("at", [0, 2])
def test_the_fault_drill_cuts_a_host_off_and_the_others_shrink(tmp_path, at):
    """bench/fault_drill.py's partition: named at the keepalive (2 s), not at the
    communicator's timeout (30 s), and the survivors agree and compute right after.
    Rank 0 hosts the store: cut off, it is the one rank every survivor's store
    connection names, with no failure report to read."""
    rows_path = tmp_path / "rows.json"
    drill = os.path.join(HERE, "..", "bench", "fault_drill.py")
    # Namespaces of its own: the two cases may run at once.
    cmd = [
        sys.executable,
        drill,
        "--hosts",
        "4",
        "--sizes",
        "4",
        "--transports",
        "tcp",
        "--failures",
        "partition",
        "--trials",
        "1",
        "--at",
        str(at),
        "--timeout",
        "30",
        "--keepalive",
        "2",
        "--case-timeout",
        "90",
        "--json",
        str(rows_path),
        "--netns",
        f"{PREFIX}d{at}x",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [row] = json.loads(rows_path.read_text())
    assert (row["reported"], row["hung"], row["errors"]) == (3, [], []), row
    assert row["agreed"] and row["wrong"] == 0, row
    assert 1.5 < row["detect_s"] < 10, row
    # Every survivor, its neighbour or not, knows the rank as unreachable, not dead.
    reports = row["reports"].values()
    assert [r["reason"] for r in reports] == ["unreachable"] * 3, reports
    assert not any("process died" in r["message"] for r in reports), reports
    # So it is counted dead without the grace a merely suspected rank gets (1.25 x
    # 2 s), and no survivor tries it as the agreement's host (2 s to give up on it).
    assert row["phases"][0] < 1.0, row


def test_newcomers_find_the_job_at_its_address_after_rank_0_died(hosts):
    # Ranks 0 and 3 on host 0 (MASTER_ADDR's), 1 and 2 on host 1. Rank 0 dies; the
    # survivors shrink, and the lowest of them (old rank 1) hosts the meeting, but it
    # cannot listen at MASTER_ADDR: old rank 3, on that machine, serves the lobby, and
    # a newcomer on host 2 finds the job there.
    names, _ = hosts
    grow_rank = os.path.join(HERE, "_grow_rank.py")
    port, token = "29411", "multihost-grow"

    def start(ns, role, rank, size):
        env = dict(os.environ, GROW_TEST_ADDR="10.232.0.1", GROW_TEST_DIE="0")
        env.pop("RINGREDUCE_HOST_ID", None)
        cmd = [
            sys.executable,
            grow_rank,
            role,
            str(rank),
            str(size),
            port,
            "tcp",
            "0",
            "shrink=0,grow=4",
            token,
        ]
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    placed = [names[0], names[1], names[1], names[0]]
    procs = [start(ns, "member", r, 4) for r, ns in enumerate(placed)]
    procs.append(start(names[2], "newcomer", 3, 4))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == -9, outs[0][1][-2000:]  # the victim
    reports = []
    for p, (out, _) in zip(procs[1:], outs[1:]):
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert p.returncode == 0 and lines, "\n---\n".join(e[-2000:] for _, e in outs)
        reports.append(json.loads(lines[-1]))
    for new_rank, m in enumerate(reports[:3]):
        assert m == {**m, "shrunk": 3, "rank": new_rank, "size": 4, "ok": True, "state": True}
    assert reports[3] == {**reports[3], "newcomer": 3, "size": 4, "ok": True, "state": True}
