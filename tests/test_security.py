"""Hostile input and authenticated joins: the store and the links parse only what
they can bound, a process without the job's token is refused with
AuthenticationError, and neither disturbs the job."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

import ringreduce as rr
from ringreduce import _core

from _ranks import free_port

# One rank of a 2-rank job, as a separate program: joins, all_reduces, prints the sum.
_RANK = r"""
import sys, numpy as np, ringreduce as rr
try:
    comm = rr.init("tcp", timeout=float(sys.argv[2]))
except rr.AuthenticationError as exc:
    print("AuthenticationError:", exc, flush=True)
    sys.exit(3)
x = np.arange(1000, dtype=np.float32) * (comm.rank + 1)
y = comm.all_reduce(x)
print("sum-ok" if np.array_equal(y, np.arange(1000, dtype=np.float32) * 3) else "sum-wrong",
      flush=True)
comm.close()
"""


def _start_rank(rank: int, port: int, token: str | None, timeout: float = 30.0):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    env["RINGREDUCE_PORT"] = str(port)
    env.pop("RINGREDUCE_TOKEN", None)
    if token is not None:
        env["RINGREDUCE_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, "-c", _RANK, str(rank), str(timeout)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_listening(port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


def _finish(proc, seconds: float = 60.0):
    out, err = proc.communicate(timeout=seconds)
    return proc.returncode, out, err


def _handshake(sock: socket.socket, token: str = "") -> bytes:
    """A client's side of the store handshake; returns the verdict byte."""
    greeting = _recv_exact(sock, 21)
    assert greeting[:4] == b"RRS4"
    nonce = os.urandom(16)
    message = b"rr-store-client" + _part(greeting[5:21]) + _part(nonce)
    proof = hmac.new(token.encode(), message, hashlib.sha256).digest()
    sock.sendall(nonce + proof)
    # The verdict, the server's proof, and its process (pid, start time, machine; zeros
    # when refused).
    return _recv_exact(sock, 1 + 32 + 28)[:1]


def _part(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _closed_by_peer(sock: socket.socket, seconds: float = 10.0) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_hmac_and_sha256_match_python():
    t = _core.testing
    for key, msg in [(b"", b""), (b"key", b"The quick brown fox"), (b"k" * 100, b"x" * 1000)]:
        assert t.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()
    for data in [b"", b"abc", b"a" * 55, b"a" * 56, b"a" * 64, b"b" * 1000]:
        assert t.sha256(data) == hashlib.sha256(data).digest()


def test_every_parser_survives_random_and_mutated_frames():
    frames = 5000
    results = _core.testing.fuzz_parsers(frames, 20261201)
    assert set(results) == {
        "store_request",
        "store_reply",
        "store_greeting",
        "link_hello",
        "call_header",
        "failure_report",
    }
    for name, r in results.items():
        assert r["frames"] == frames, name
        assert r["violations"] == 0, (name, r["first_violation"])
        assert r["accepted"] > 0, name  # the generator makes valid frames too
        if name != "failure_report":  # which accepts anything, bounded
            assert r["rejected"] > frames // 10, name


@pytest.mark.parametrize("token", [None, "s3cret-job-token"])
def test_store_survives_hostile_connections(token):
    port = free_port()
    rank0 = _start_rank(0, port, token)
    try:
        _wait_listening(port)
        hostile = []
        # The packet: a key length that wraps 9 + klen.
        big_key = bytes([1]) + struct.pack("<I", 0xFFFFFFF8) + b"\0" * 16
        # A value length far over the limit: the store must not buffer it.
        big_value = bytes([1]) + struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0xFFFFFFF0)
        unknown = bytes([77]) + b"\0" * 20
        for frame in [big_key, big_value, unknown]:
            s = socket.create_connection(("127.0.0.1", port))
            verdict = _handshake(s, token or "")
            assert verdict == b"\0"
            s.sendall(frame)
            assert _closed_by_peer(s), frame[:8]
            s.close()
        # Random bytes before any handshake, and a silent connection.
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(os.urandom(4000))
        hostile.append(s)
        hostile.append(socket.create_connection(("127.0.0.1", port)))
        if token:
            # A proof made with the wrong token is refused, and the connection closed.
            s = socket.create_connection(("127.0.0.1", port))
            assert _handshake(s, "wrong") == b"\1"
            assert _closed_by_peer(s)
            s.close()
        rank1 = _start_rank(1, port, token)
        code1, out1, err1 = _finish(rank1)
        code0, out0, err0 = _finish(rank0)
        assert (code0, code1) == (0, 0), (err0, err1)
        assert out0.strip() == out1.strip() == "sum-ok"
        # The store said which connections it closed and why (one line each).
        assert "malformed request: key of 4294967288 bytes" in err0
        assert "malformed request: value of 4294967280 bytes" in err0
        assert "malformed request: unknown command 77" in err0
        for s in hostile:
            s.close()
    finally:
        for p in [rank0]:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize(
    "intruder, expected",
    [
        ("wrong-token", "refused this process's token"),
        (None, "requires the job's token and this process has none"),
    ],
)
def test_process_without_the_token_is_refused_and_job_goes_on(intruder, expected):
    port = free_port()
    rank0 = _start_rank(0, port, "the-job-token")
    try:
        _wait_listening(port)
        start = time.monotonic()
        code, out, err = _finish(_start_rank(1, port, intruder))
        assert code == 3, (out, err)
        assert "AuthenticationError:" in out and expected in out, out
        assert time.monotonic() - start < 20  # refused at once, not at a timeout
        code1, out1, err1 = _finish(_start_rank(1, port, "the-job-token"))
        code0, out0, err0 = _finish(rank0)
        assert (code0, code1) == (0, 0), (err0, err1)
        assert out0.strip() == out1.strip() == "sum-ok"
        if intruder:
            assert "did not prove the job's token" in err0
    finally:
        if rank0.poll() is None:
            rank0.kill()


def test_token_given_to_a_job_without_one_is_an_authentication_error():
    port = free_port()
    rank0 = _start_rank(0, port, None, timeout=10)
    try:
        _wait_listening(port)
        code, out, _ = _finish(_start_rank(1, port, "a-token"))
        assert code == 3
        assert "has a token but the rendezvous store" in out
    finally:
        rank0.kill()
        rank0.communicate()


def test_authentication_error_is_a_ringreduce_error():
    assert issubclass(rr.AuthenticationError, rr.RingReduceError)


def _listening_addresses(port: int) -> set:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            addr, hexport = fields[1].split(":")
            if int(hexport, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(addr)
    return found


def test_store_listens_on_loopback_when_master_addr_is_loopback():
    port = free_port()
    rank0 = _start_rank(0, port, None, timeout=10)
    try:
        _wait_listening(port)
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
    finally:
        rank0.kill()
        rank0.communicate()


def test_launcher_gives_its_ranks_one_random_token(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "import os, ringreduce as rr\n"
        "comm = rr.init()\n"
        "tokens = comm.all_gather_object(os.environ['RINGREDUCE_TOKEN'])\n"
        "assert len(set(tokens)) == 1 and len(tokens[0]) >= 32, tokens\n"
        "print('token-ok', flush=True)\n"
        "comm.close()\n"
    )
    env = dict(os.environ)
    env.pop("RINGREDUCE_TOKEN", None)
    out = subprocess.run(
        [sys.executable, "-m", "ringreduce", "launch", "-n", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("token-ok") == 2, out.stdout
