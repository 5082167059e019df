"""ringreduce launch: rank environment, [rank] prefixes, and stopping a failed job.

Every launcher run is a real subprocess with a timeout, so a launcher that hangs fails
the test instead of the suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ringreduce.launch import free_port, launch

LAUNCH = [sys.executable, "-m", "ringreduce", "launch"]
ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RINGREDUCE_PORT",
    "PYTHONUNBUFFERED",
)
PRINT_ENV = (
    "import os, sys\n"
    f"print(' '.join(k + '=' + os.environ.get(k, '-') for k in {ENV_KEYS!r}))\n"
    "print('transport=' + os.environ.get('RINGREDUCE_TRANSPORT', '-'))\n"
    "print('on-stderr', file=sys.stderr)\n"
)


def run_launch(args: list, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LAUNCH, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def prefixed(text: str) -> dict:
    """{rank: [lines without prefix]} from [rank]-prefixed output; fails on other lines."""
    out: dict = {}
    for line in text.splitlines():
        m = re.match(r"^\[(\d+)\] (.*)$", line)
        assert m, f"line without [rank] prefix: {line!r}"
        out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_env_and_prefixes():
    port = free_port()
    r = run_launch(["-n", "3", "--master-port", str(port), "--", sys.executable, "-c", PRINT_ENV])
    assert r.returncode == 0, r.stderr
    lines = prefixed(r.stdout)
    assert sorted(lines) == [0, 1, 2]
    for rank, (env_line, transport_line) in lines.items():
        env = dict(kv.split("=", 1) for kv in env_line.split())
        assert env == {
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RINGREDUCE_PORT": str(port + 1),  # torch.distributed's env:// has MASTER_PORT
            "PYTHONUNBUFFERED": "1",
        }
        assert transport_line == "transport=-"
    # stderr stays on stderr, prefixed too.
    assert prefixed(r.stderr) == {k: ["on-stderr"] for k in range(3)}


def test_free_port_transport_and_no_prefix():
    r = run_launch(
        ["-n", "2", "--transport", "tcp", "--no-prefix", "--", sys.executable, "-c", PRINT_ENV]
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not any(line.startswith("[") for line in lines)
    ports = {re.search(r"MASTER_PORT=(\d+)", line).group(1) for line in lines if "RANK=" in line}
    assert len(ports) == 1 and 1024 <= int(ports.pop()) <= 65535
    assert lines.count("transport=tcp") == 2


def test_free_port_avoids_the_ephemeral_range(monkeypatch):
    """A port the kernel hands out for bind(0) or connect() can be taken by any outgoing
    connection between the probe and the store's bind: free ports come from outside that
    range, both ports of the run free; a range that leaves no room falls back to bind(0)."""
    import socket

    from ringreduce.launch import ports

    lo, hi = ports._ephemeral_range()
    for _ in range(20):
        p = free_port()
        assert not (lo <= p <= hi) and not (lo <= p + 1 <= hi), (p, lo, hi)
        for q in (p, p + 1):
            with socket.socket() as s:
                s.bind(("127.0.0.1", q))
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 65535))
    p = free_port(span=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_free_port_leaves_the_standby_band_to_the_ranks(monkeypatch):
    """Every rank of a fault-tolerant job binds a standby store in the band below the
    ephemeral range (membership.py); a port a launcher picks there could be taken by one
    of them before the job binds it, so free ports come from neither range."""
    from ringreduce.launch import ports

    first, end = ports.standby_band()
    lo, _ = ports._ephemeral_range()
    assert first < end == max(2048, lo)
    for _ in range(200):
        p = free_port(span=2)
        assert not (first <= p < end) and not (first <= p + 1 < end), (p, first, end)
    # An ephemeral range that starts low leaves no room below the band: then the band is
    # shared again, rather than falling back to the kernel's ephemeral ports.
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (20000, 65535))
    assert ports._candidate_ranges(2) == [(10000, 19998)]


def test_line_without_newline_and_py_script(tmp_path):
    script = tmp_path / "prog.py"  # not executable: a .py program runs under this python
    script.write_text("import os, sys\nprint('arg', sys.argv[1], os.environ['RANK'], end='')\n")
    r = run_launch(["-n", "2", "--", str(script), "hello"])
    assert r.returncode == 0, r.stderr
    lines = prefixed(r.stdout)
    assert lines == {0: ["arg hello 0"], 1: ["arg hello 1"]}


def test_failing_rank_stops_the_others():
    prog = (
        "import os, sys, time\n"
        "print(os.getpid(), flush=True)\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(120)\n"
    )
    start = time.monotonic()
    r = run_launch(["-n", "3", "--", sys.executable, "-c", prog], timeout=60)
    assert time.monotonic() - start < 30
    assert r.returncode == 3
    assert "rank 1 exited with code 3" in r.stderr
    assert "rank 1 was the first to fail" in r.stderr
    pids = [int(lines[0]) for lines in prefixed(r.stdout).values()]
    assert len(pids) == 3 and all(pid_gone(p) for p in pids)


def test_killed_rank_and_sigterm_ignored():
    # The survivors ignore SIGTERM, so only the SIGKILL after --grace can end the job.
    prog = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(120)\n"
    )
    start = time.monotonic()
    r = run_launch(["-n", "3", "--grace", "0.5", "--", sys.executable, "-c", prog], timeout=60)
    assert time.monotonic() - start < 30
    assert r.returncode == 128 + signal.SIGKILL
    assert "rank 0 was killed by SIGKILL" in r.stderr
    assert "sending SIGKILL" in r.stderr


def test_sigint_is_forwarded_and_summarised_in_one_line():
    prog = "import os, time\nprint('ready', os.getpid(), flush=True)\ntime.sleep(120)\n"
    with subprocess.Popen(
        [*LAUNCH, "-n", "2", "--", sys.executable, "-c", prog],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as proc:
        pids = []
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            m = re.match(r"^\[\d\] ready (\d+)$", line.strip())
            if m:
                pids.append(int(m.group(1)))
        assert len(pids) == 2, "ranks did not start"
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        _, err = proc.communicate(timeout=10)
    assert code == 128 + signal.SIGINT
    assert all(pid_gone(p) for p in pids)
    # One line for the interrupt, not one KeyboardInterrupt traceback per rank.
    assert "Traceback" not in err, err
    assert err.count("interrupted (SIGINT): stopped 2 ranks") == 1, err


def test_missing_program():
    r = run_launch(["-n", "2", "--", "no-such-program-ringreduce"])
    assert r.returncode == 127
    assert "cannot run" in r.stderr


def test_usage_errors():
    assert run_launch(["-n", "2"]).returncode == 2  # no program
    assert run_launch(["--", "true"]).returncode == 2  # no -n


def test_launch_function(capsys):
    code = launch(2, [sys.executable, "-c", "import os; print('hi', os.environ['RANK'])"])
    assert code == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["[0] hi 0", "[1] hi 1"]
    assert launch(1, [sys.executable, "-c", "raise SystemExit(5)"]) == 5
    with pytest.raises(ValueError):
        launch(0, ["true"])


def test_real_ranks_all_reduce():
    prog = (
        "import numpy as np, ringreduce as rr\n"
        "comm = rr.init(timeout=30)\n"
        "x = np.full(5, comm.rank + 1.0)\n"
        "print(comm.rank, comm.world_size, comm.all_reduce(x).tolist())\n"
        "comm.close()\n"
    )
    r = run_launch(["-n", "3", "--", sys.executable, "-c", prog], timeout=120)
    assert r.returncode == 0, r.stderr
    lines = prefixed(r.stdout)
    for rank in range(3):
        assert lines[rank] == [f"{rank} 3 {[6.0] * 5}"]


def test_torchrun_spellings_and_several_nodes():
    # Two launchers on this machine play two nodes of 2 ranks each: torchrun's options
    # give every rank its global RANK, and the four meet as one job.
    port = free_port()
    prog = (
        "import os, numpy as np, ringreduce as rr\n"
        "comm = rr.init(timeout=60)\n"
        "x = comm.all_reduce(np.full(3, comm.rank + 1.0))\n"
        "print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['GROUP_RANK'], x.tolist())\n"
        "comm.close()\n"
    )
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    nodes = [
        subprocess.Popen(
            [
                *LAUNCH,
                *common,
                "--node-rank",
                str(node),
                "--master-port",
                str(port),
                "--",
                sys.executable,
                "-c",
                prog,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=120) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
    seen = {}
    for out, _ in outputs:
        for lines in prefixed(out).values():
            rank, local_rank, world, group, total = lines[0].split(" ", 4)
            seen[int(rank)] = (int(local_rank), int(world), int(group), total)
    assert seen == {r: (r % 2, 4, r // 2, str([10.0] * 3)) for r in range(4)}


def test_several_nodes_need_master_addr():
    # Without node 0's address every node would look for the rendezvous on itself and
    # wait out the timeout: refused at once, naming the option.
    start = time.monotonic()
    r = run_launch(
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "-n",
            "2",
            "--master-port",
            "29999",
            "--",
            sys.executable,
            "-c",
            "print('ran')",
        ]
    )
    assert time.monotonic() - start < 20
    assert r.returncode == 2 and "ran" not in r.stdout
    assert "--master-addr" in r.stderr
    with pytest.raises(ValueError, match="master-addr"):
        launch(2, ["true"], nnodes=2, node_rank=0, master_port=29999)


def test_second_node_prefixes_and_blames_global_ranks():
    # Node 1 of 2 with 2 ranks each runs RANK 2 and 3: its prefixes and its failure
    # messages must say so, not the local indices 0 and 1.
    prog = (
        "import os, sys, time\n"
        "print('rank', os.environ['RANK'], flush=True)\n"
        "if os.environ['RANK'] == '3':\n"
        "    time.sleep(0.3); sys.exit(4)\n"
        "time.sleep(60)\n"
    )
    args = [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "-n",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--",
        sys.executable,
        "-c",
        prog,
    ]
    r = run_launch(args, timeout=60)
    assert r.returncode == 4, r.stderr
    assert prefixed(r.stdout) == {2: ["rank 2"], 3: ["rank 3"]}
    assert "rank 3 exited with code 4" in r.stderr
    assert "rank 3 was the first to fail" in r.stderr
    assert "rank 1 " not in r.stderr


def test_help_shows_an_example():
    r = run_launch(["-h"])
    assert r.returncode == 0
    assert "examples:" in r.stdout and "--nproc-per-node" in r.stdout


def test_real_rank_failure_ends_job():
    # Rank 1 dies while the others wait in a collective: they must not hang.
    prog = (
        "import os, sys, numpy as np, ringreduce as rr\n"
        "comm = rr.init(timeout=60)\n"
        "comm.barrier()\n"
        "if comm.rank == 1:\n"
        "    os._exit(3)\n"
        "comm.all_reduce(np.ones(1000))\n"
    )
    start = time.monotonic()
    r = run_launch(["-n", "3", "--", sys.executable, "-c", prog], timeout=120)
    assert time.monotonic() - start < 50  # well before the 60 s collective timeout
    assert r.returncode != 0
    assert "job failed" in r.stderr
