"""Hierarchical all_reduce across emulated hosts (RINGREDUCE_HOST_ID per rank).

Reduce-scatter on each host (shared memory), all-reduce of each rank's chunk
across hosts (one ring per local rank), all-gather on each host. Checked
against numpy for every dtype and op, bit for bit alike on every rank, for
hosts of consecutive ranks and for ranks dealt round-robin over the hosts,
and by the bytes that cross between hosts: 2(H-1)/H x S per host, split
evenly over its ranks.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import ringreduce as rr

import _ranks
from _data import (
    DTYPES,
    all_reduce_exact_calls,
    all_reduce_exact_failures,
    extended,
    np_dtype,
    sizes_for,
)
from _ranks import RankGroup

# The host of each rank, by layout.
LAYOUTS = {
    "2x2": [0, 0, 1, 1],
    "3x2": [0, 0, 1, 1, 2, 2],
    "2x2-interleaved": [0, 1, 0, 1],  # host of rank r = r % 2
    "2x3-interleaved": [0, 1, 0, 1, 0, 1],
}


def _serve_on_hosts(rank: int, size: int, port: int, conn, init_kwargs: dict) -> None:
    """_ranks._serve with this rank's host taken from init_kwargs["hosts"]."""
    _ranks.take_parent_env(init_kwargs)
    hosts = init_kwargs.pop("hosts")
    os.environ["RINGREDUCE_HOST_ID"] = f"hierarchical-test-host-{hosts[rank]}"
    algorithms = init_kwargs.pop("algorithms", None)
    if algorithms:
        os.environ["RINGREDUCE_ALGORITHM"] = algorithms[rank]
    _ranks.TRANSPORTS["given-hosts"] = ("auto", 0)  # this process only: hosts are set
    init_kwargs["transport"] = "given-hosts"
    _ranks._serve(rank, size, port, conn, init_kwargs)


class HostGroup(RankGroup):
    """RankGroup whose rank r runs on emulated host hosts[r]."""

    def __init__(
        self,
        hosts: list,
        *,
        timeout: float = 60.0,
        env: dict | None = None,
        algorithms: list | None = None,
        context=None,
    ):
        """context: how rank processes start (_ranks._CTX, forked from a server; pass
        _ranks.SPAWN where the test reads the ranks' stderr with capfd: a forkserver's
        children write to the server's)."""
        super().__init__(
            len(hosts),
            timeout=timeout,
            target=_serve_on_hosts,
            context=context,
            hosts=list(hosts),
            env=dict(env or {}),
            algorithms=algorithms,
        )


@pytest.fixture
def host_group():
    groups = []

    def make(layout: str, **env: str) -> HostGroup:
        group = HostGroup(LAYOUTS[layout], env=env)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.close()


# ---- rank-side functions (module level so they pickle by reference) -------


def _digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def _exact_every_op(comm, dtypes):
    """Exact data: bit for bit the numpy reference, out of place, in place and out=;
    every call hierarchical."""
    failures = []
    before = comm.stats()["all_reduce_algorithms"]["hierarchical"]
    for dtype in dtypes:
        failures += all_reduce_exact_failures(comm, dtype)
    calls = sum(all_reduce_exact_calls(comm.world_size, dtype) for dtype in dtypes)
    ran = comm.stats()["all_reduce_algorithms"]["hierarchical"] - before
    if ran != calls:
        failures.append(f"{ran} of {calls} calls ran hierarchical")
    return failures


def _random_digests(comm, dtype, op, count, seed):
    """Random data: the result's bits on this rank, and its worst error against float64."""
    n, r = comm.world_size, comm.rank
    parts = [np.random.default_rng(seed + i).standard_normal(count) for i in range(n)]
    if op in ("prod",):
        parts = [1 + 0.1 * p for p in parts]
    x = parts[r].astype(np_dtype(dtype))
    got = comm.all_reduce(x, op=op)
    inputs = np.stack([p.astype(np_dtype(dtype)).astype(np.float64) for p in parts])
    if op == "sum":
        want = inputs.sum(axis=0)
    elif op == "avg":
        want = inputs.sum(axis=0) / n
    elif op == "prod":
        want = inputs.prod(axis=0)
    elif op == "min":
        want = inputs.min(axis=0)
    else:
        want = inputs.max(axis=0)
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if count else 0.0
    return _digest(got), err


def _algorithms_by_size(comm, counts):
    """Which algorithm each all_reduce of float32 `count` ran."""
    ran = []
    for count in counts:
        before = comm.stats()["all_reduce_algorithms"]
        comm.all_reduce(np.ones(count, dtype=np.float32))
        after = comm.stats()["all_reduce_algorithms"]
        ran.append([name for name in after if after[name] != before[name]])
    return ran


def _bytes_of_one_call(comm, nbytes):
    x = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
    before = comm.stats()
    comm.all_reduce(x, out=x)
    after = comm.stats()
    n = comm.world_size
    assert np.all(x == n * (n + 1) / 2)
    return {
        key: after[key] - before[key]
        for key in (
            "bytes_sent",
            "bytes_received",
            "bytes_sent_between_hosts",
            "bytes_received_between_hosts",
        )
    }


def _device_buffers(comm, dtype):
    """The device executor's path (the CPU stand-in for CUDA memory)."""
    from test_device_staging import _all_reduce

    before = comm.stats()["all_reduce_algorithms"]["hierarchical"]
    # Sizes below 200 elements: with 40-byte segments every element is a few messages.
    failures = _all_reduce(comm, dtype, [c for c in sizes_for(comm.world_size) if c < 200])
    if comm.stats()["all_reduce_algorithms"]["hierarchical"] == before:
        failures.append("no call ran hierarchical")
    return failures


# ---- tests --------------------------------------------------------------


@pytest.mark.parametrize("layout", ["2x2", extended("3x2"), extended("2x2-interleaved")])
def test_exact_every_dtype_op_and_size(host_group, layout):
    # Forced, so that the small sizes (count 0, 1, < ranks) run it too.
    group = host_group(layout, RINGREDUCE_ALGORITHM="hierarchical")
    assert group.run(_exact_every_op, DTYPES, timeout=300) == [[]] * group.n


@pytest.mark.parametrize(
    "layout, dtype",
    [("3x2", "float32"), ("2x3-interleaved", "bfloat16")]
    + [
        extended(layout, dtype)
        for layout in ("3x2", "2x3-interleaved")
        for dtype in ("float16", "bfloat16", "float32", "float64")
        if (layout, dtype) not in (("3x2", "float32"), ("2x3-interleaved", "bfloat16"))
    ],
)
def test_random_floats_same_bits_on_every_rank(host_group, layout, dtype):
    group = host_group(layout, RINGREDUCE_ALGORITHM="hierarchical")
    eps = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1.2e-7, "float64": 2.3e-16}[dtype]
    for op in ["sum", "avg", "prod", "min", "max"]:
        for count in [1, 5, 10_007]:
            results = group.run(_random_digests, dtype, op, count, 99)
            digests = {d for d, _ in results}
            assert len(digests) == 1, f"{op} count={count}: ranks differ"
            # Each of the N-1 reductions (and avg's division) rounds once, to
            # values of magnitude below N x max|input| (about 5 sigma).
            bound = group.n * eps * group.n * 6 * (2 if op == "prod" else 1)
            assert max(e for _, e in results) <= bound, (op, count, results)


def test_auto_chooses_hierarchical_above_the_small_message_size(host_group):
    group = host_group("2x2")
    # small_bytes 64 KiB at 2 ranks: 32 KiB at 4. 8 floats take the direct
    # path (shared memory reaches only the host's ranks: the small one).
    ran = group.run(_algorithms_by_size, [8, 1 << 16, 1 << 20])
    assert ran == [[["small"], ["hierarchical"], ["hierarchical"]]] * 4


def test_ring_knob_forces_the_flat_ring(host_group):
    group = host_group("2x2", RINGREDUCE_ALGORITHM="ring")
    ran = group.run(_algorithms_by_size, [1, 1 << 16])
    assert ran == [[["ring"], ["ring"]]] * 4


def test_hosts_of_different_sizes_fall_back_to_the_ring():
    with HostGroup([0, 0, 1], env={"RINGREDUCE_ALGORITHM": "hierarchical"}) as group:
        ran = group.run(_algorithms_by_size, [1, 1 << 16])
        assert ran == [[["ring"], ["ring"]]] * 3
        for failures in group.run(_exact_every_op, ["float32", "int32"]):
            # Correct results, none of them hierarchical.
            assert len(failures) == 1 and failures[0].startswith("0 of "), failures


@pytest.mark.parametrize("dtype", ["float16", extended("int32")])
def test_device_buffers_and_segments_smaller_than_a_chunk(host_group, dtype):
    from _fake_cuda import FAKE_DEVICE_ENV

    # 40-byte segments: chunks and pieces of every phase span several messages.
    env = dict(FAKE_DEVICE_ENV, RINGREDUCE_ALGORITHM="hierarchical", RINGREDUCE_SEGMENT_BYTES="40")
    group = host_group("3x2", **env)
    assert group.run(_device_buffers, dtype, timeout=300) == [[]] * group.n


def _one_call_error(comm):
    try:
        comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None, ""


def test_ranks_forcing_different_algorithms_get_mismatch_error():
    with HostGroup([0, 0, 1, 1], algorithms=["hierarchical"] * 3 + ["ring"], timeout=20) as group:
        outcomes = group.outcomes(_one_call_error)
    for status, value, tb in outcomes:
        assert status == "ok", tb
        kind, message = value
        assert kind == "MismatchError", message
    # Rank 3 (ring) checks rank 2's header, rank 0 checks rank 3's.
    assert "(hierarchical)" in outcomes[3][1][1]


def test_bad_algorithm_name_is_a_value_error():
    from ringreduce import _core

    options = _core.Options()
    options.algorithm = "hierarchical"
    assert options.algorithm == "hierarchical"
    with pytest.raises(ValueError, match="RINGREDUCE_ALGORITHM"):
        options.algorithm = "tree"


@pytest.mark.parametrize(
    "layout", ["2x2", extended("3x2"), extended("2x2-interleaved"), "2x3-interleaved"]
)
def test_bytes_between_hosts(host_group, layout):
    """Each host sends 2(H-1)/H x S to other hosts, S/L-sized shares from each of its L
    ranks; the flat ring sends one share across per ring hop that leaves the host."""
    hosts = LAYOUTS[layout]
    n = len(hosts)
    h = len(set(hosts))
    local = n // h
    nbytes = 6 << 20  # divisible by every N, L and H here
    header = 40  # the call header, sent to the next rank by number

    hier = host_group(layout, RINGREDUCE_ALGORITHM="hierarchical").run(_bytes_of_one_call, nbytes)
    flat = host_group(layout, RINGREDUCE_ALGORITHM="ring").run(_bytes_of_one_call, nbytes)

    per_rank_total = 2 * (n - 1) * nbytes // n
    per_rank_across = 2 * (h - 1) * nbytes // (h * local)
    for r in range(n):
        crosses = hosts[(r + 1) % n] != hosts[r]  # the header's hop
        from_left = hosts[(r - 1) % n] != hosts[r]
        # The same total as the flat ring: 2(N-1)/N x S per rank.
        assert hier[r]["bytes_sent"] == per_rank_total + header
        assert flat[r]["bytes_sent"] == per_rank_total + header
        assert hier[r]["bytes_sent_between_hosts"] == per_rank_across + header * crosses
        assert hier[r]["bytes_received_between_hosts"] == per_rank_across + header * from_left
        assert flat[r]["bytes_sent_between_hosts"] == (per_rank_total + header) * crosses

    for host in set(hosts):
        ranks = [r for r in range(n) if hosts[r] == host]
        across = sum(hier[r]["bytes_sent_between_hosts"] for r in ranks)
        headers = header * sum(hosts[(r + 1) % n] != host for r in ranks)
        assert across - headers == 2 * (h - 1) * nbytes // h
        flat_across = sum(flat[r]["bytes_sent_between_hosts"] for r in ranks)
        assert flat_across - headers == per_rank_total * sum(
            hosts[(r + 1) % n] != host for r in ranks
        )
        assert across < flat_across


def _broadcast_once(comm):
    return comm.broadcast(np.ones(4), root=0).tolist()


def test_debug_log_says_which_algorithm_runs_and_why(capfd):
    # RINGREDUCE_DEBUG=algorithm: one stderr line per collective, from every rank.
    debug = {"RINGREDUCE_DEBUG": "algorithm"}
    with HostGroup(LAYOUTS["2x2"], env=debug, context=_ranks.SPAWN) as group:
        assert group.run(_algorithms_by_size, [8, 1 << 18]) == [[["small"], ["hierarchical"]]] * 4
        group.run(_broadcast_once)
    lines = [line for line in capfd.readouterr().err.splitlines() if "ringreduce rank" in line]
    for rank in range(4):
        mine = [line for line in lines if line.startswith(f"ringreduce rank {rank}: ")]
        small, big, bcast = (
            next(line for line in mine if what in line)
            for what in ("count=8,", "count=262144,", "broadcast(")
        )
        assert "32 B <= the small-message limit of 32 KiB at 4 ranks" in small, small
        assert small.endswith("N-1 steps of whole vectors: small"), small
        assert "1 MiB > the small-message limit" in big, big
        assert "span 2 hosts of 2 ranks" in big and big.endswith(": hierarchical"), big
        assert "(call #" in big and "broadcast has one schedule" in bcast, bcast


def test_debug_log_names_the_knob_and_why_hierarchical_cannot_run(capfd):
    env = {"RINGREDUCE_DEBUG": "all", "RINGREDUCE_ALGORITHM": "hierarchical"}
    with HostGroup([0, 0, 1], env=env, context=_ranks.SPAWN) as group:
        group.run(_algorithms_by_size, [1 << 16])
    logged = [line for line in capfd.readouterr().err.splitlines() if "ringreduce rank" in line]
    # Host 0's two ranks also say how their shared-memory waits go; then one line per
    # rank for the all_reduce.
    shm = [line for line in logged if ": shared memory: " in line]
    assert sorted(line.split(":")[0] for line in shm) == ["ringreduce rank 0", "ringreduce rank 1"]
    lines = [line for line in logged if line not in shm]
    assert len(lines) == 3, lines
    for line in lines:
        assert (
            "RINGREDUCE_ALGORITHM=hierarchical, but the hierarchical all_reduce cannot run " in line
        )
        assert "(it needs several hosts with the same number of ranks, more than one" in line
        assert line.endswith(": ring"), line


def test_debug_log_says_ranks_on_one_host_share_it(capfd, monkeypatch):
    # All on one host: the reason is that, not hosts "of different sizes" (the hosts are
    # not compared at all there).
    monkeypatch.setenv("RINGREDUCE_DEBUG", "algorithm")
    with RankGroup(3, transport="shm", context=_ranks.SPAWN) as group:
        assert group.run(_algorithms_by_size, [1 << 18]) == [[["ring"]]] * 3
    lines = [line for line in capfd.readouterr().err.splitlines() if "count=262144," in line]
    assert len(lines) == 3, lines
    for line in lines:
        assert line.endswith("bandwidth-bound; all 3 ranks share one host: ring"), line


def test_unknown_debug_topic_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("RINGREDUCE_DEBUG", "algorithm,colour")
    with pytest.raises(ValueError, match=r"RINGREDUCE_DEBUG: unknown topic\(s\) \['colour'\]"):
        rr.init("tcp", rank=0, world_size=1)
