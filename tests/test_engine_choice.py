"""The engine's choice of all_reduce algorithm as a pure function of a job's shape and
settings (_core.engine_algorithm, what ringreduce.model follows): the same answer as
running communicators give, at the small-message limit and on either side of it."""

from __future__ import annotations

import pytest
from test_hierarchical import _algorithms_by_size

from ringreduce import _core

ALL_REDUCE = _core.Collective.ALL_REDUCE


def options(**values) -> _core.Options:
    o = _core.Options()
    for k, v in values.items():
        setattr(o, k, v)
    return o


def test_small_message_limit_scales_as_2_over_n():
    assert _core.small_message_bytes(64 << 10, 1) == 0
    assert _core.small_message_bytes(64 << 10, 2) == 64 << 10
    assert _core.small_message_bytes(64 << 10, 4) == 32 << 10
    assert _core.small_message_bytes(64 << 10, 8) == 16 << 10
    assert _core.small_message_bytes(10000, 3) == 6666
    assert _core.small_message_bytes(0, 4) == 0


def test_rule_without_ranks():
    o = options()
    limit = _core.small_message_bytes(o.small_bytes, 8)

    def pick(nbytes, n=8, local=8, reaches_all=True, opts=o, kind=ALL_REDUCE):
        return _core.engine_algorithm(kind, nbytes, n, local, reaches_all, opts)

    assert pick(limit) == "direct"
    assert pick(limit + 1) == "ring"
    assert pick(limit, reaches_all=False) == "small"
    assert pick(1 << 30, local=4) == "hierarchical"  # 2 hosts of 4
    assert pick(1 << 30, local=3) == "ring"  # hosts of 3, 3 and 2 ranks: no rings line up
    assert pick(1 << 30, local=1) == "ring"  # a rank per host
    assert pick(0, n=1, local=1) == "ring"  # nothing to exchange
    assert pick(8, kind=_core.Collective.BROADCAST) == "ring"  # one schedule
    assert pick(8, local=4, opts=options(algorithm="ring")) == "ring"
    assert pick(8, local=4, opts=options(algorithm="hierarchical")) == "hierarchical"
    assert pick(8, local=8, opts=options(algorithm="hierarchical")) == "ring"
    assert pick(8, opts=options(small_bytes=0)) == "ring"
    why = _core.explain_engine_algorithm(ALL_REDUCE, 1 << 30, 8, 4, False, o)
    assert why.endswith(": hierarchical") and "2 hosts of 4 ranks" in why, why
    with pytest.raises(ValueError):
        pick(8, n=0, local=1)
    with pytest.raises(ValueError):
        pick(8, n=4, local=5)


def _shape(comm):
    return comm.world_size, comm.local_world_size


# Whether a transport reaches every peer directly: shared memory does, TCP only the
# ring neighbours (so every peer only at 2 ranks).
REACHES_ALL = {"shm": lambda n: True, "tcp": lambda n: n == 2, "shm+tcp": lambda n: n == 2}


def _agree(group, links, n, o):
    """The algorithm every rank ran at sizes around the limit is the function's."""
    world, local = group.run(_shape)[0]
    limit = _core.small_message_bytes(o.small_bytes, world)
    counts = [1, limit // 4, limit // 4 + 1, 1 << 18]  # float32: 4 bytes each
    want = [
        _core.engine_algorithm(ALL_REDUCE, 4 * c, world, local, REACHES_ALL[links](n), o)
        for c in counts
    ]
    assert want[1] in ("direct", "small") and want[2] in ("ring", "hierarchical")
    ran = group.run(_algorithms_by_size, counts)
    assert ran == [[[a] for a in want]] * n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_running_communicators_agree(group_factory, links, n):
    _agree(group_factory(n, transport=links), links, n, options())


def test_running_communicators_agree_on_a_limit_set_by_hand(group_factory):
    # 10000 x 2/3 = 6666 bytes: 1666 floats take the latency path, 1667 the ring.
    group = group_factory(3, small_bytes=10000, transport="tcp")
    _agree(group, "tcp", 3, options(small_bytes=10000))
