"""Shared fixtures: one long-lived rank group per world size, reused across tests."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _ranks import RankGroup  # noqa: E402

_groups: dict = {}


@pytest.fixture(scope="session")
def group_factory():
    """group_factory(n) -> a RankGroup of n ranks, created once per session."""

    def get(
        n: int,
        segment_bytes: int = 0,
        small_bytes: int = -1,
        fake_device: bool = False,
        transport: str = "tcp",
    ) -> RankGroup:
        """segment_bytes/small_bytes set RINGREDUCE_SEGMENT_BYTES/_SMALL_BYTES (0/-1: default);
        fake_device makes the engine's Device the CPU emulation (tests/_fake_cuda.py);
        transport is a key of _ranks.TRANSPORTS ("tcp", "shm", "shm+tcp")."""
        key = (n, segment_bytes, small_bytes, fake_device, transport)
        if key not in _groups:
            env = {"RINGREDUCE_SEGMENT_BYTES": str(segment_bytes)} if segment_bytes else {}
            if small_bytes >= 0:
                env["RINGREDUCE_SMALL_BYTES"] = str(small_bytes)
            if fake_device:
                env["RINGREDUCE_TEST_FAKE_DEVICE"] = "1"
            _groups[key] = RankGroup(n, env=env, transport=transport)
        return _groups[key]

    yield get
    for g in _groups.values():
        g.close()
    _groups.clear()


@pytest.fixture(params=["tcp", "shm", "shm+tcp"])
def links(request):
    """Each transport a collective test runs on: TCP, shared memory, and both at once
    (two emulated hosts)."""
    return request.param
