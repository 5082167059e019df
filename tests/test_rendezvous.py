"""Rendezvous: rank/size from each launcher's environment, and the file store."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ringreduce import _env

from _ranks import free_port, run_ranks

LAUNCHER_ENVS = [
    {"RANK": "2", "WORLD_SIZE": "4"},
    {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "2", "PMI_SIZE": "4"},
    {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"},
]
ALL_VARS = {k for env in LAUNCHER_ENVS for k in env} | {"PMIX_RANK", "PMIX_SIZE"}


@pytest.mark.parametrize("env", LAUNCHER_ENVS, ids=lambda e: next(iter(e)))
def test_rank_and_size_from_each_launcher(monkeypatch, env):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _env.rank_and_size(None, None) == (2, 4)
    assert _env.rank_and_size(1, None) == (1, 4)  # explicit arguments win


def test_no_environment_means_a_world_of_one(monkeypatch):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    assert _env.rank_and_size(None, None) == (0, 1)
    with pytest.raises(ValueError, match="rank and world_size"):
        _env.rank_and_size(3, None)


@pytest.mark.parametrize("present", ["RANK", "WORLD_SIZE"])
def test_half_of_rank_and_world_size_is_an_error(monkeypatch, present):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(present, "1")
    missing = "WORLD_SIZE" if present == "RANK" else "RANK"
    with pytest.raises(ValueError, match=f"{present}=1 is set but {missing} is not"):
        _env.rank_and_size(None, None)
    assert _env.rank_and_size(0, 2) == (0, 2)  # both given: the environment is not read


def test_master_address_defaults_and_validation(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("RINGREDUCE_PORT", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert _env.master_address(None, None) == ("127.0.0.1", 29500)
    monkeypatch.setenv("MASTER_PORT", "12345")
    assert _env.master_address(None, None) == ("127.0.0.1", 12345)
    # Under torchrun its agent's store holds MASTER_PORT: ours is the next one.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert _env.master_address(None, None) == ("127.0.0.1", 12346)
    monkeypatch.setenv("RINGREDUCE_PORT", "23456")
    assert _env.master_address(None, None) == ("127.0.0.1", 23456)
    assert _env.master_address("h", 7) == ("h", 7)
    with pytest.raises(ValueError, match="master_port"):
        _env.master_address("h", 70000)


def _sum_ranks(comm):
    return int(comm.all_reduce(np.array([comm.rank], dtype=np.int64))[0])


@pytest.mark.parametrize("n", [2, 3])
def test_file_store_rendezvous(tmp_path, n):
    outcomes = run_ranks(n, _sum_ranks, store_dir=str(tmp_path / "store"), timeout=30)
    assert [o[1] for o in outcomes] == [sum(range(n))] * n, [o[2] for o in outcomes]


def _held(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port, as another program's store would hold it."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


_RANK = (
    "import sys, numpy as np, ringreduce as rr\n"
    "rank, port = int(sys.argv[1]), int(sys.argv[2])\n"
    "with rr.init('tcp', rank=rank, world_size=2, master_addr='127.0.0.1',\n"
    "             master_port=port, timeout=20) as comm:\n"
    "    print(comm.all_reduce(np.full(3, rank + 1.0, np.float32)).tolist())\n"
)


def _ranks(port: int, n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(r), str(port)],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in range(n)
    ]


def test_a_store_port_held_for_a_moment_is_waited_for():
    # A job restarted on the same MASTER_PORT while the old store is still closing, or
    # another program's probe of the port: rank 0's store binds once it is free.
    port = free_port()
    holder = _held(port)
    procs = _ranks(port, 2)
    time.sleep(0.5)
    holder.close()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == "[3.0, 3.0, 3.0]"


def test_a_store_port_held_throughout_is_an_error_naming_it():
    port = free_port()
    holder = _held(port)
    try:
        (rank0,) = _ranks(port, 1)
        out, err = rank0.communicate(timeout=60)  # a few seconds, not the 20 s timeout
    finally:
        holder.close()
    assert rank0.returncode != 0
    assert f"cannot bind 127.0.0.1:{port}" in err and "another program holds it" in err, err


def _silent_store(listener: socket.socket) -> None:
    """A store host elsewhere as a client sees it: it welcomes the client (no token),
    names no process on this machine (all zero) and then answers nothing."""
    conn, _ = listener.accept()
    with conn:
        nonce = os.urandom(16)
        conn.sendall(b"RRS4" + b"\0" + nonce)
        answer = b""
        while len(answer) < 48:
            answer += conn.recv(48 - len(answer))
        parts = b"".join(struct.pack("<I", 16) + n for n in (nonce, answer[:16]))
        proof = hmac.new(b"", b"rr-store-server" + parts, hashlib.sha256).digest()
        conn.sendall(b"\0" + proof + bytes(4 + 8 + 16))
        while conn.recv(4096):  # read requests, answer none, until the client closes
            pass


def test_a_store_request_left_unanswered_ends_the_connection_s_use():
    # A host that does not answer (stopped on another machine, or starved of CPU) keeps
    # its socket open. The request times out after its I/O timeout; later ones fail at
    # once, instead of each waiting again (a failure report makes three in a row) or
    # reading the late reply of the first as theirs.
    from ringreduce import _core
    from ringreduce.errors import TimeoutError as RRTimeout

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        server = threading.Thread(target=_silent_store, args=(listener,), daemon=True)
        server.start()
        client = _core.TcpStore("127.0.0.1", listener.getsockname()[1], False, 10.0, 0.5, "")
        start = time.monotonic()
        with pytest.raises(RRTimeout) as first:
            client.try_get("k")
        assert time.monotonic() - start >= 0.45, "did not wait for the I/O timeout"
        assert "not used again" not in str(first.value)
        with pytest.raises(
            RRTimeout,
            match="did not answer a request within 0.5 s; this connection to it is not used again",
        ):
            client.try_get("k")
        with pytest.raises(RRTimeout, match="not used again"):
            client.set("other", b"x")
        del client  # closes the connection: the server's thread ends
        server.join(10)


@pytest.mark.parametrize("check", [True, False])
def test_a_stopped_store_host_on_this_machine_is_not_waited_for_in_a_failure_report(check):
    # The store tells its process to a client that proved the token. With the host stop
    # check on (as while a failure report runs), a client on the same machine that sees
    # it stopped in /proc (SIGSTOP, a debugger) fails the request in a fraction of a
    # second, where it would wait out the whole I/O timeout (20 s here) for a host
    # elsewhere; later requests fail at once. Off (every other request), a host paused
    # by a debugger or a profiler is waited for, and the request goes on when it resumes.
    from ringreduce import _core
    from ringreduce.errors import TimeoutError as RRTimeout

    port = free_port()
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ringreduce import _core\n"
            f"s = _core.TcpStore('127.0.0.1', {port}, True, 30.0, 5.0, '')\n"
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout.readline().strip() == "ready"
        client = _core.TcpStore("127.0.0.1", port, False, 10.0, 20.0, "")
        client.set("k", b"v")
        assert client.try_get("k") == b"v"
        client.set_host_stop_check(check)
        host.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10  # a signal takes effect a moment later
        while _state(host.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        if not check:
            got = []
            waiter = threading.Thread(target=lambda: got.append(client.try_get("k")))
            waiter.start()
            time.sleep(1.0)  # five times the check's 0.2 s
            assert waiter.is_alive(), got  # still waiting for the host
            host.send_signal(signal.SIGCONT)
            waiter.join(15)
            assert got == [b"v"]
            return
        start = time.monotonic()
        with pytest.raises(RRTimeout, match=f"process {host.pid} on this machine, is stopped"):
            client.try_get("k")
        assert time.monotonic() - start < 10.0
        with pytest.raises(
            RRTimeout, match="was found stopped .*; this connection to it is not used again"
        ):
            client.set("other", b"x")
    finally:
        host.send_signal(signal.SIGCONT)
        host.kill()
        host.wait()
        host.stdout.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _store_and_clients(n):
    from ringreduce import _core

    server = _core.TcpStore("127.0.0.1", 0, True, 10.0, 5.0, "")
    return server, [_core_client(server.port) for _ in range(n)]


def _wait_in_thread(store, key, ms, into):
    start = time.monotonic()
    into.append((store.wait_get(key, ms), time.monotonic() - start))


def test_a_wait_is_held_until_its_key_is_set():
    # How ranks meet: a wait for a key another rank has yet to set is answered when it
    # is set (set or set_if_absent), not at the end of the wait, nor polled for.
    server, (waiter, other) = _store_and_clients(2)
    for setter in ("set", "set_if_absent"):
        key = f"key-{setter}"
        got = []
        thread = threading.Thread(target=_wait_in_thread, args=(waiter, key, 1000, got))
        thread.start()
        time.sleep(0.1)
        # Meanwhile the server answers everyone else.
        assert other.try_get(key) is None and thread.is_alive()
        getattr(other, setter)(key, b"value")
        thread.join(10)
        [(value, seconds)] = got
        assert value == b"value"
        assert seconds < 0.9, f"answered after {seconds:.2f} s: at the end of the wait"
    # A key already there is answered at once; one nobody sets, with None after its time.
    assert waiter.wait_get("key-set", 1000) == b"value"
    start = time.monotonic()
    assert waiter.wait_get("never", 200) is None
    assert time.monotonic() - start >= 0.19
    assert waiter.wait_get("never", 0) is None
    # The connection goes on as before.
    waiter.set("after", b"1")
    assert other.try_get("after") == b"1"
    server.close()


def test_the_store_s_host_erases_keys_by_prefix_and_counts_them():
    # How a standby store that hosts agreement after agreement stays small: its host
    # drops the rounds no one reads (membership._forget). Only the host can.
    server, (client,) = _store_and_clients(1)
    for key in (
        "c/agree/1/0/in/0",
        "c/agree/1/0/in/1",
        "c/agree/1/0/decision",
        "c/agree/10/0/in/0",
        "c/agree/2/0/decision",
        "c/agree/1",
    ):
        client.set(key, b"x")
    assert server.key_count() == 6
    assert server.erase_prefix("c/agree/1/0/in/") == 2
    assert server.erase_prefix("c/agree/1/") == 1  # not round 10's, nor the key "c/agree/1"
    assert server.erase_prefix("c/agree/1/") == 0
    assert server.key_count() == 3
    assert client.try_get("c/agree/1/0/decision") is None
    assert client.try_get("c/agree/10/0/in/0") == b"x" and client.try_get("c/agree/1") == b"x"
    # A wait held for a key erased meanwhile is answered when it is set again.
    got = []
    thread = threading.Thread(
        target=_wait_in_thread, args=(client, "c/agree/1/0/decision", 1000, got)
    )
    thread.start()
    time.sleep(0.1)
    server.erase_prefix("c/")
    assert server.key_count() == 0
    server.set("c/agree/1/0/decision", b"again")
    thread.join(10)
    assert got and got[0][0] == b"again"
    with pytest.raises(ValueError, match="only by the process that serves the store"):
        client.erase_prefix("c/")
    with pytest.raises(ValueError, match="only the process that serves the store counts"):
        client.key_count()
    server.close()


def test_many_keys_are_read_and_set_together_in_order():
    # How a rank reads every rank's key at once (Store::try_get_many: the gets sent
    # together): values in the order asked, None where missing, a key set by another
    # client and known here only from the server's notice too, and batches larger
    # than a socket's buffers either way (many keys; replies of megabytes).
    server, (reader, other) = _store_and_clients(2)
    keys = [f"rank/{r}/host" for r in range(3000)]  # over 16 KiB of requests: several batches
    for r in range(0, 3000, 3):
        other.set(keys[r], f"h{r}".encode())
    other.set_if_absent("first", b"noticed")  # the server tells the other clients
    got = reader.try_get_many(keys + ["first", "missing"])
    assert got[:3000] == [f"h{r}".encode() if r % 3 == 0 else None for r in range(3000)]
    assert got[3000:] == [b"noticed", None]
    assert reader.try_get_many([]) == []
    big = [f"big/{i}" for i in range(12)]
    for i, key in enumerate(big):
        other.set(key, bytes([i]) * (1 << 20))
    values = reader.try_get_many(big)
    assert [len(v) for v in values] == [1 << 20] * 12
    assert all(v == bytes([i]) * (1 << 20) for i, v in enumerate(values))
    # Sets together likewise (set_many), batches of them, one of megabytes among them.
    items = [(f"s/{i}", str(i).encode()) for i in range(2000)] + [("s/big", b"b" * (3 << 20))]
    reader.set_many(items)
    assert other.try_get_many([key for key, _ in items]) == [value for _, value in items]
    reader.set_many([])
    # The connection goes on as before.
    reader.set("after", b"1")
    assert other.wait_get("after", 1000) == b"1"
    with pytest.raises(ValueError, match="over the store's limits"):
        reader.try_get_many(["x" * 2000])
    with pytest.raises(ValueError, match="over the store's limits"):
        reader.set_many([("k", b"v")] * 3000 + [("x" * 2000, b"v")])
    assert other.try_get("k") is None  # none of them set
    server.close()


def test_a_first_value_is_told_to_every_client_and_a_claim_to_none():
    # set_if_absent's first value reaches every other client in a notice, so that a
    # first failure is known even once the store's host is gone; a claim (a seat,
    # which only its setter reads back) is answered alike and told to nobody: at init
    # N seats would otherwise cost rank 0's store N notices each.
    from ringreduce import RingReduceError

    server, (setter, other) = _store_and_clients(2)
    assert setter.set_if_absent("first_error", b"rank 3") == b"rank 3"
    assert setter.claim("seat/1", b"ticket") == b"ticket"
    assert other.claim("seat/1", b"another") == b"ticket"  # taken: the first value
    assert other.set_if_absent("first_error", b"rank 5") == b"rank 3"
    late = _core_client(server.port)  # a third client, there when the next two are set
    setter.set_if_absent("told", b"yes")
    setter.claim("quiet", b"yes")
    time.sleep(0.1)
    server.close()  # the host goes: only what late was told remains readable there
    assert late.try_get("told") == b"yes"
    with pytest.raises(RingReduceError):
        late.try_get("quiet")


def _core_client(port):
    from ringreduce import _core

    return _core.TcpStore("127.0.0.1", port, False, 10.0, 5.0, "")


def _request(cmd: int, key: bytes, value: bytes) -> bytes:
    return bytes([cmd]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value


def _reply(sock) -> tuple:
    from test_security import _recv_exact

    head = _recv_exact(sock, 5)
    status, length = head[0], struct.unpack("<I", head[1:])[0]
    return status, _recv_exact(sock, length)


def test_requests_behind_a_held_wait_and_clients_that_leave_while_held():
    from test_security import _closed_by_peer, _handshake

    server, (setter,) = _store_and_clients(1)
    # A client that sends a get right behind its wait gets both answers, in order.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        assert _handshake(sock) == b"\0"
        sock.sendall(_request(4, b"later", b"1000") + _request(2, b"there", b""))
        setter.set("there", b"yes")
        time.sleep(0.1)
        setter.set("later", b"now")
        sock.settimeout(5)
        assert _reply(sock) == (0, b"now")
        assert _reply(sock) == (0, b"yes")
    # One that leaves while held, and one held while its time runs out: the server goes on.
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert _handshake(sock) == b"\0"
            sock.sendall(_request(4, b"nobody-sets-this", b"1000"))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        assert _handshake(sock) == b"\0"
        sock.sendall(_request(4, b"nobody-sets-this", b"50"))
        sock.settimeout(5)
        assert _reply(sock) == (1, b"")
    setter.set("k", b"v")
    assert setter.wait_get("k", 1000) == b"v"
    # A wait that is not 0 to 1000 decimal milliseconds ends the connection.
    for bad in (b"5000", b"12ms", b"", b"-1"):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert _handshake(sock) == b"\0"
            sock.sendall(_request(4, b"k", bad))
            assert _closed_by_peer(sock), bad
    server.close()
