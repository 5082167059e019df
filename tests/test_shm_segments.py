"""Shared-memory segments are checked before they are trusted.

Rank 0 is a real communicator made in this process on a store of the test's own; rank 1
is played by a thread that answers the rendezvous as a rank would, then publishes a
segment record that lies in one way or another: the wrong size, a file not yet sized
(which used to be mapped and touched: SIGBUS), a stale inode, a header that is not
ringreduce's, garbage. Each time rank 0 must raise a RingReduceError naming rank 1 and
the reason, and leave no mapping behind.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import ringreduce as rr
from ringreduce import _core

pytestmark = pytest.mark.skipif(
    not hasattr(os, "memfd_create"), reason="needs memfd_create and /proc: runs on Linux"
)


class DictStore:
    """The store interface create_with_store takes, in this process's memory."""

    def __init__(self):
        self._data = {}
        self._lock = threading.Lock()

    def set(self, key, value):
        with self._lock:
            self._data[key] = bytes(value)

    def try_get(self, key):
        with self._lock:
            return self._data.get(key)

    def set_if_absent(self, key, value):
        with self._lock:
            return self._data.setdefault(key, bytes(value))

    def wait(self, key, seconds=10.0):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.try_get(key)
            if value is not None:
                return value
            time.sleep(0.001)
        raise TimeoutError(key)


def _memfd(size: int, header: bytes = b"") -> int:
    fd = os.memfd_create("ringreduce-test")
    os.ftruncate(fd, size)
    if header:
        os.pwrite(fd, header, 0)
    return fd


def _fake_rank_1(store: DictStore, lie, kept: list):
    """Joins as rank 1 of 2, then publishes what `lie(own_record)` returns as its
    segment record; `own_record` is rank 0's (pid, fd, inode, bytes, nonce)."""
    ticket = "00000000000000aa"
    store.set("rr/w2/ask/1", ticket.encode())
    comm_id = store.wait(f"rr/w2/answer/1/{ticket}").decode()
    prefix = f"rr/{comm_id}/"
    store.set_if_absent(prefix + "seat/1", ticket.encode())
    store.set(prefix + "host/1", store.wait(prefix + "host/0"))
    pid, fd, inode, nbytes, nonce = store.wait(prefix + "shm/0").decode().split(":")
    record = lie(int(nbytes), kept)
    store.set(prefix + "shm/1", record.encode())


def _record(fd: int, nbytes: int, inode=None, nonce="0123456789abcdef") -> str:
    inode = os.fstat(fd).st_ino if inode is None else inode
    return f"{os.getpid()}:{fd}:{inode}:{nbytes}:{nonce}"


def _wrong_size(nbytes, kept):
    fd = _memfd(4096)
    kept.append(fd)
    return _record(fd, 4096)


def _not_sized_yet(nbytes, kept):
    # What a reused store used to hand out: a live fd whose file has no pages yet.
    fd = _memfd(0)
    kept.append(fd)
    return _record(fd, nbytes)


def _stale_inode(nbytes, kept):
    fd = _memfd(nbytes)
    kept.append(fd)
    return _record(fd, nbytes, inode=os.fstat(fd).st_ino + 1)


def _not_a_segment(nbytes, kept):
    fd = _memfd(nbytes, header=b"\x00" * 64)
    kept.append(fd)
    return _record(fd, nbytes)


def _garbage(nbytes, kept):
    return "not:a:record"


def _dead_fd(nbytes, kept):
    return f"{os.getpid()}:987654:1:{nbytes}:0123456789abcdef"  # an fd number never opened


CASES = [
    (_wrong_size, "has another layout"),
    (_not_sized_yet, "refusing to map it"),
    (_stale_inode, "now holds another file"),
    (_not_a_segment, "not a ringreduce segment"),
    (_garbage, "published no valid segment record"),
]


def _shm_options():
    options = _core.Options()
    options.transport = "shm"
    options.timeout_seconds = 10.0
    options.point_to_point = False
    return options


def _memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:ringreduce" in line for line in f)


@pytest.mark.parametrize("lie, reason", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_a_lying_segment_record_is_a_clear_error_naming_the_peer(lie, reason):
    store = DictStore()
    kept: list = []
    options = _shm_options()
    before = _memfd_mappings()
    peer = threading.Thread(target=_fake_rank_1, args=(store, lie, kept), daemon=True)
    peer.start()
    try:
        with pytest.raises(rr.RingReduceError) as info:
            _core.Communicator.create_with_store(store, 0, 2, "127.0.0.1", "a test store", options)
    finally:
        peer.join(10)
        for fd in kept:
            os.close(fd)
    message = str(info.value)
    assert "rank 1" in message and reason in message, message
    assert not isinstance(info.value, rr.TimeoutError), message
    # Neither our own segment nor a half-attached one stays mapped.
    assert _memfd_mappings() == before


def test_an_fd_that_is_not_open_is_named_too():
    store = DictStore()
    kept: list = []
    options = _shm_options()
    peer = threading.Thread(target=_fake_rank_1, args=(store, _dead_fd, kept), daemon=True)
    peer.start()
    with pytest.raises(rr.RingReduceError, match="cannot open the segment of rank 1"):
        _core.Communicator.create_with_store(store, 0, 2, "127.0.0.1", "a test store", options)
    peer.join(10)


@pytest.mark.parametrize("through_mapping", [True, False], ids=["mapping", "kept-fd"])
def test_a_segment_holds_memory_for_what_is_reserved_in_it(through_mapping):
    # A segment is sized, not filled: its header's pages are reserved when it is made, an
    # inbox's when a sender reserves them: through its fd while connecting, then through
    # its mapping, or through the fd it keeps on kernels that cannot (before 5.14). 1 MiB
    # made, 100000 bytes reserved by an attached peer once connected.
    page = os.sysconf("SC_PAGE_SIZE")
    kept, before, after = _core.testing.shm_reserve(1 << 20, 300_000, 100_000, through_mapping)
    assert kept == (not through_mapping)
    assert 0 < before <= 2 * page  # the header
    assert 100_000 <= after - before <= 100_000 + 2 * page
