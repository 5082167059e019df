"""Shared fixtures: one long-lived rank group per world size, reused across tests."""

from __future__ import annotations

import os
import sys
from collections import OrderedDict

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _ranks import RankGroup  # noqa: E402

# The groups kept, least recently used first. Each holds its rank processes (idle, but
# memory and pids): beyond _MAX_GROUPS the oldest is closed, and it is made again if a
# later test asks for it.
_MAX_GROUPS = 20
_groups: OrderedDict[tuple, RankGroup] = OrderedDict()


def pytest_addoption(parser):
    parser.addoption(
        "--extended",
        action="store_true",
        help="also run the extended matrix: the cases marked 'extended' (larger worlds and "
        "more dtypes on the transports beyond the arithmetic matrix's, more layouts, "
        "repeats). CI runs it after the default suite.",
    )


# Files whose tests take longest (torch's own suite, the mpirun suite, DDP/FSDP against
# gloo, trainers, jobs that kill and add ranks):
# they start first, so that with several test processes (-n) none is left running
# alone at the end.
_LONGEST_FIRST = (
    "test_torch_backend_suite.py",
    "test_mpi.py",
    "test_torch_backend.py",
    "test_churn.py",
    "test_trainers.py",
    "test_torchft.py",
    "test_grow.py",
    "test_elastic.py",
    "test_shrink.py",
    "test_torch_shrink.py",
    "test_bucketing_ft.py",
    "test_multihost.py",
    "test_signals.py",
    "test_usability.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = os.path.basename(str(item.fspath))
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file is kept
    if config.getoption("--extended"):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("extended") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def group_factory():
    """group_factory(n) -> a RankGroup of n ranks, kept for later tests (see _MAX_GROUPS)."""

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
        group = _groups.get(key)
        if group is not None and not group.alive():
            # A rank exited (idle too long, or a test broke it): start the group afresh.
            del _groups[key]
            group.close()
            group = None
        if group is None:
            env = {"RINGREDUCE_SEGMENT_BYTES": str(segment_bytes)} if segment_bytes else {}
            if small_bytes >= 0:
                env["RINGREDUCE_SMALL_BYTES"] = str(small_bytes)
            if fake_device:
                env["RINGREDUCE_TEST_FAKE_DEVICE"] = "1"
            group = RankGroup(n, env=env, transport=transport)
            _groups[key] = group
            while len(_groups) > _MAX_GROUPS:
                _, oldest = _groups.popitem(last=False)
                oldest.close()
        _groups.move_to_end(key)
        return group

    yield get
    for g in _groups.values():
        g.close()
    _groups.clear()


@pytest.fixture(params=["tcp", "shm", "shm+tcp"])
def links(request):
    """Each transport a collective test runs on: TCP, shared memory, and both at once
    (two emulated hosts)."""
    return request.param
