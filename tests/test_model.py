"""The cost model (ringreduce.model): the design's worked example, the algorithms' byte
and step counts, the engine's choice of algorithm, calibration, and the CLI."""

from __future__ import annotations

import math

import pytest

from ringreduce import _core
from ringreduce.model import COLLECTIVES, CostModel, Link, Sample, fit

S7B = 7e9 * 2  # a 7B model's fp16 gradients, bytes


def worked_example_model(gbps: float, alpha: float = 0.0) -> CostModel:
    """8 ranks, each on its own link of gbps Gbit/s, free reduction (the worked example:
    7B parameters in fp16 on 8 ranks, 100 or 25 GB/s, 0.5 s of compute)."""
    return CostModel(hosts=8, links={"tcp": Link.from_gbps(gbps, alpha=alpha)})


def test_worked_example_at_100_and_25_gbs():
    fast = worked_example_model(800).step(S7B, 0.5)
    assert fast.rounded_comm_s == pytest.approx(0.28)
    assert round(fast.rounded_fraction, 2) == 0.36
    slow = worked_example_model(200).step(S7B, 0.5)
    assert slow.rounded_comm_s == pytest.approx(1.12)
    assert round(slow.rounded_fraction, 2) == 0.69


def test_exact_ring_bytes_are_2_n_minus_1_over_n():
    st = worked_example_model(800).step(S7B, 0.5)
    assert st.ring_factor == pytest.approx(1.75)
    # Without latency the model's time is the exact byte count at the link's rate.
    assert st.comm_s == pytest.approx(1.75 * S7B / 100e9)
    assert st.comm_s < st.rounded_comm_s
    p = worked_example_model(800).predict("all_reduce", S7B)
    assert p.algorithm == "ring"
    assert p.sent_bytes == pytest.approx(2 * 7 / 8 * S7B)
    assert p.busbw == pytest.approx(100.0)  # busbw is the link rate when bandwidth-bound


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_ring_sends_2_n_minus_1_over_n_at_any_n(n):
    p = CostModel(hosts=n).predict("all_reduce", 1 << 30, "ring")
    assert p.sent_bytes == pytest.approx(2 * (n - 1) / n * (1 << 30))
    steps = sum(ph.steps for ph in p.phases)
    assert steps == 2 * (n - 1) + 1  # two phases and the call header


def test_overlap_hides_communication_shorter_than_backward():
    st = worked_example_model(800).step(S7B, 0.5)
    assert st.exposed_s < st.comm_s
    assert st.rounded_overlap_fraction < 0.01  # 0.28 s fits in 0.33 s of backward
    slow = worked_example_model(200).step(S7B, 0.5)
    assert slow.rounded_exposed_s == pytest.approx(1.12 - 0.5 * 2 / 3)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_time_grows_with_size_and_shrinks_with_bandwidth(collective):
    m = CostModel(hosts=2, ranks_per_host=2, links={"tcp": Link.from_gbps(1)}, reduce_gbs=5)
    sizes = [1 << k for k in range(4, 31, 3)]
    times = [m.predict(collective, s).seconds for s in sizes]
    assert all(b >= a for a, b in zip(times, times[1:]))
    faster = m.with_links(tcp=Link.from_gbps(10))
    assert faster.predict(collective, 1 << 26).seconds <= m.predict(collective, 1 << 26).seconds
    if collective != "barrier":
        assert times[-1] > times[0]


# Shapes the model describes, and whether their transport reaches every peer directly
# (shared memory and MPI do; TCP only the ring neighbours, so every peer only at 2 ranks).
SHAPES = [
    (dict(ranks_per_host=8), True),
    (dict(ranks_per_host=8, intra_link="tcp"), False),
    (dict(ranks_per_host=2, intra_link="tcp"), True),
    (dict(ranks_per_host=3, intra_link="mpi"), True),
    (dict(hosts=2, ranks_per_host=2), False),
    (dict(hosts=4, ranks_per_host=1), False),
    (dict(hosts=2, ranks_per_host=4, intra_link="mpi", inter_link="mpi"), True),
    (dict(hosts=3, ranks_per_host=2, small_bytes=10000), False),
    (dict(ranks_per_host=4, small_bytes=0), True),
    (dict(), True),
]


@pytest.mark.parametrize("shape, reaches_all", SHAPES)
def test_engine_rule_is_the_engines(shape, reaches_all):
    """The model asks the engine's own rule (_core.engine_algorithm) with its shape,
    its links and its small_bytes, at the limit and on either side of it."""
    m = CostModel(**shape)
    assert m.reaches_every_peer() == reaches_all
    options = _core.Options()
    options.small_bytes = m.small_bytes
    limit = _core.small_message_bytes(m.small_bytes, m.ranks)
    assert m.small_limit() == limit
    for nbytes in (0, 1, max(limit - 1, 0), limit, limit + 1, limit + 0.5, 1 << 30):
        engine = _core.engine_algorithm(
            _core.Collective.ALL_REDUCE,
            math.ceil(nbytes),
            m.ranks,
            m.ranks_per_host,
            reaches_all,
            options,
        )
        assert m.engine_algorithm(nbytes) == engine, (shape, nbytes)
        assert m.choose(max(nbytes, 1)).engine == m.engine_algorithm(max(nbytes, 1))


def test_engine_rule_at_the_threshold():
    # small_bytes x 2 / N: 64 KiB at 2 ranks, 16 KiB at 8 (the engine's defaults).
    shm8 = CostModel(ranks_per_host=8)
    assert shm8.small_limit() == shm8.small_bytes * 2 // 8
    assert shm8.engine_algorithm(shm8.small_limit()) == "direct"  # shm reaches every peer
    assert shm8.engine_algorithm(shm8.small_limit() + 4) == "ring"
    tcp8 = CostModel(ranks_per_host=8, intra_link="tcp")
    assert tcp8.engine_algorithm(1024) == "small"  # TCP reaches ring neighbours only
    assert CostModel(ranks_per_host=2, intra_link="tcp").engine_algorithm(1024) == "direct"
    assert CostModel(ranks_per_host=4, small_bytes=0).engine_algorithm(8) == "ring"
    assert CostModel(hosts=2, ranks_per_host=2).engine_algorithm(1 << 30) == "hierarchical"
    assert CostModel(hosts=2, ranks_per_host=2).candidates() == ("ring", "small", "hierarchical")
    assert CostModel(hosts=4).candidates() == ("ring", "small")


def test_defaults_are_the_engines():
    from ringreduce import model

    assert model.DEFAULT_SMALL_BYTES == _core.Options().small_bytes
    assert model.DEFAULT_SEGMENT_BYTES == _core.Options().segment_bytes
    assert CostModel().small_bytes == _core.Options().small_bytes


def _ran(comm, counts):
    """Which all_reduce algorithm each call of float32 ``count`` ran on this rank."""
    import numpy as np

    out = []
    for count in counts:
        before = comm.stats()["all_reduce_algorithms"]
        comm.all_reduce(np.ones(count, dtype=np.float32))
        after = comm.stats()["all_reduce_algorithms"]
        out += [name for name in after if after[name] != before[name]]
    return out


@pytest.mark.parametrize(
    "links, n, shape",
    [
        ("tcp", 3, dict(ranks_per_host=3, intra_link="tcp")),
        ("shm", 4, dict(ranks_per_host=4)),
        ("shm+tcp", 4, dict(hosts=2, ranks_per_host=2)),
    ],
)
def test_engine_rule_matches_running_ranks(group_factory, links, n, shape):
    """What the model says the engine runs is what running ranks run."""
    m = CostModel(**shape)
    limit = m.small_limit()
    counts = [1, limit // 4, limit // 4 + 1, 1 << 18]
    ran = group_factory(n, transport=links).run(_ran, counts)
    assert ran == [[m.engine_algorithm(4 * c) for c in counts]] * n


def test_choice_latency_paths_small_ring_large_hierarchical_across_hosts():
    m = CostModel(ranks_per_host=8, links={"shm": Link.from_gbs(5, alpha=5e-6)})
    assert m.choose(256).fastest == "direct"
    assert m.choose(64 << 20).fastest == "ring"
    assert "bandwidth-bound" in m.choose(64 << 20).reason
    two_by_two = CostModel(hosts=2, ranks_per_host=2, links={"tcp": Link.from_gbps(1)})
    c = two_by_two.choose(64 << 20)
    assert c.engine == "hierarchical" and c.fastest == "hierarchical"  # the engine's auto rule
    # 1.5 S vs 1.0 S per direction on each host's link: about 1.5x.
    ratio = c.seconds["ring"] / c.seconds["hierarchical"]
    assert 1.4 < ratio <= 1.5


def test_hierarchical_cross_host_bytes():
    m = CostModel(hosts=4, ranks_per_host=4, links={"tcp": Link.from_gbps(10, alpha=0)})
    p = m.predict("all_reduce", 1 << 30, "hierarchical")
    cross = [ph for ph in p.phases if ph.link == "tcp" and ph.wire_bytes > 0]
    assert len(cross) == 1
    assert cross[0].wire_bytes == pytest.approx(2 * 3 / 4 * (1 << 30))
    with pytest.raises(ValueError):
        CostModel(hosts=4).predict("all_reduce", 1 << 20, "hierarchical")


def test_rooted_and_pairwise_counts():
    n, s = 4, float(1 << 24)
    m = CostModel(ranks_per_host=n, links={"shm": Link(0.0, 1e-9)})
    assert m.predict("gather", s).seconds == pytest.approx((n - 1) * s * 1e-9)
    assert m.predict("scatter", s).seconds == pytest.approx((n - 1) * s / n * 1e-9)
    assert m.predict("all_to_all", s).seconds == pytest.approx((n - 1) * s / n * 1e-9)
    assert m.predict("all_gather", s).seconds == pytest.approx((n - 1) * s * 1e-9)
    assert m.predict("reduce_scatter", s).seconds == pytest.approx((n - 1) * s / n * 1e-9)
    # broadcast pipelines: S plus N-2 segments through the chain.
    assert m.predict("broadcast", s).seconds == pytest.approx((s + 2 * (128 << 10)) * 1e-9)
    assert m.predict("barrier", 0).seconds == 0.0  # no latency in this model
    assert CostModel(ranks_per_host=1).predict("all_reduce", s).seconds == 0.0


def test_reduce_scatter_pays_a_latency_per_round_of_pieces():
    m = CostModel(ranks_per_host=4, links={"shm": Link(1e-5, 0.0)})
    # chunk of 16 MiB / 4 = 4 MiB, pieces of 4 x 128 KiB: 8 rounds of 3 steps, + header.
    assert m.predict("reduce_scatter", 16 << 20).seconds == pytest.approx((8 * 3 + 1) * 1e-5)


def _synthetic(truth: CostModel, kinds: dict[str, Link], n: int) -> list[Sample]:
    out = []
    for kind in kinds:
        m = CostModel(ranks_per_host=n, intra_link=kind, links=kinds, reduce_gbs=truth.reduce_gbs)
        for coll, sizes in {
            "all_gather": (4 << 10, 64 << 10, 1 << 20, 4 << 20),
            "all_reduce": (4 << 10, 256 << 10, 1 << 20, 16 << 20),
        }.items():
            for s in sizes:
                out.append(Sample(coll, s, n, kind, m.predict(coll, s).seconds))
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_fit_recovers_known_parameters(n):
    kinds = {"shm": Link(2e-6, 1 / 8e9), "tcp": Link(40e-6, 1 / 1.2e9)}
    truth = CostModel(reduce_gbs=6.0)
    links, reduce_gbs = fit(_synthetic(truth, kinds, n))
    for kind, link in kinds.items():
        assert links[kind].alpha == pytest.approx(link.alpha, rel=1e-6)
        assert links[kind].beta == pytest.approx(link.beta, rel=1e-6)
    assert reduce_gbs == pytest.approx(6.0, rel=1e-6)


def test_fit_with_noise_and_a_free_reduction():
    kinds = {"shm": Link(3e-6, 1 / 5e9)}
    samples = _synthetic(CostModel(), kinds, 4)
    noisy = [
        Sample(s.collective, s.nbytes, s.ranks, s.link, s.seconds * (1.03 if i % 2 else 0.97))
        for i, s in enumerate(samples)
    ]
    links, reduce_gbs = fit(noisy)
    assert links["shm"].beta == pytest.approx(1 / 5e9, rel=0.1)
    assert links["shm"].alpha == pytest.approx(3e-6, rel=0.3)
    assert reduce_gbs is None or reduce_gbs > 20  # no reduction cost in the data


def run_cli(capsys, *args: str) -> str:
    from ringreduce.model.cli import main

    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "gbps, exact, rounded, share, rounded_share",
    [("800", "0.245 s", "0.280 s", "33%", "36%"), ("200", "0.980 s", "1.120 s", "66%", "69%")],
)
def test_cli_reproduces_the_worked_example(capsys, gbps, exact, rounded, share, rounded_share):
    out = run_cli(
        capsys,
        *("--params", "7e9", "--dtype", "float16", "--ranks", "8", "--link-gbps", gbps),
        *("--compute-s", "0.5", "--alpha-us", "0"),
    )
    assert "S = 14.00 GB" in out
    assert "2(N-1)/N x S = 1.750 x 14.00 GB =  24.50 GB" in out
    assert "2 x S (2(N-1)/N rounded to 2)   =  28.00 GB" in out
    assert "seed" not in out  # a word from how the project began, not one a user knows
    lines = {ln.split("  ")[1].strip(): ln.split() for ln in out.splitlines() if "  " in ln}
    row = next(v for k, v in lines.items() if k.startswith("all_reduce of S"))
    assert row[-4:] == [*exact.split(), *rounded.split()]
    row = next(v for k, v in lines.items() if k.startswith("communication share, no overlap"))
    assert row[-2:] == [share, rounded_share]


def test_cli_topology_and_calls(capsys):
    out = run_cli(
        capsys,
        *("--hosts", "2", "--ranks-per-host", "2", "--link-gbps", "1", "--size", "64M"),
        *("--collective", "all"),
    )
    assert "N = 4 ranks = 2 hosts x 2 ranks" in out
    for c in COLLECTIVES:
        assert any(ln.startswith(c + " ") for ln in out.splitlines()), c
    assert "model: hierarchical" in out  # the fastest is named first


def test_cli_takes_the_engine_settings_from_the_environment(capsys, monkeypatch):
    from ringreduce.model.cli import main

    monkeypatch.setenv("RINGREDUCE_SMALL_BYTES", "0")  # no latency path: the ring
    assert "1 KiB > 0 B (small_bytes x 2/N): ring" in run_cli(
        capsys, "--ranks", "4", "--size", "1K"
    )
    monkeypatch.delenv("RINGREDUCE_SMALL_BYTES")
    assert "engine: 1 KiB <= " in run_cli(capsys, "--ranks", "4", "--size", "1K")  # default
    monkeypatch.setenv("RINGREDUCE_SMALL_BYTES", "64k")  # a mistake is said, not ignored
    with pytest.raises(SystemExit):
        main(["--ranks", "4", "--size", "1K"])
    assert "RINGREDUCE_SMALL_BYTES" in capsys.readouterr().err


def test_cli_rejects_a_bad_topology(capsys):
    from ringreduce.model.cli import main

    with pytest.raises(SystemExit):
        main(["--ranks", "6", "--hosts", "4"])


def test_ringreduce_command_has_model(capsys):
    from ringreduce.cli import main

    assert main(["model", "--ranks", "4", "--size", "1M"]) == 0
    assert "all_reduce" in capsys.readouterr().out


def test_probe_at_two_ranks_fits_every_sample():
    """A real probe: two local ranks over shared memory, sizes from 4 KB to 8 MB.

    8 MB copies for milliseconds, well above what a loaded machine adds to a 4 KB call
    (up to half a millisecond seen with three busy loops on 2 cores); with 1 MB at the
    top, one such outlier let the fit put every size's time in alpha (beta = 0).
    """
    from ringreduce.model.probe import probe

    sizes = {"all_gather": (4 << 10, 1 << 20, 8 << 20), "all_reduce": (4 << 10, 8 << 20)}
    samples = probe(2, ("shm",), sizes, rounds=2)
    assert [(s.collective, s.nbytes) for s in samples] == [
        (c, n) for c, ns in sizes.items() for n in ns
    ]
    assert all(s.ranks == 2 and s.link == "shm" and s.seconds > 0 for s in samples)
    links, _ = fit(samples)
    assert links["shm"].beta > 0 and math.isfinite(links["shm"].gbs)


def _job(seconds_by_size):
    """A probe job's samples at 2 ranks over shm: all_gather and all_reduce, these times."""
    return [
        Sample(c, n, 2, "shm", t) for c in ("all_gather", "all_reduce") for n, t in seconds_by_size
    ]


def test_probe_runs_a_disturbed_job_again(monkeypatch):
    """A job whose 8 MB calls took no longer than its 4 KB ones (every call descheduled on
    a busy machine) is measured again, and only the undisturbed job's samples are kept."""
    from ringreduce.model import probe as probe_module

    flat = _job([(4 << 10, 2e-3), (8 << 20, 2e-3)])
    good = _job([(4 << 10, 8e-6), (8 << 20, 2e-3)])
    jobs = [flat, good]
    monkeypatch.setattr(probe_module, "_run_job", lambda *a: jobs.pop(0))
    samples = probe_module.probe(2, ("shm",), rounds=1)
    assert samples == good and not jobs
    assert fit(samples)[0]["shm"].beta > 0


def test_probe_says_the_machine_is_too_busy_instead_of_fitting_no_bandwidth(monkeypatch):
    from ringreduce.model import probe as probe_module

    runs = []
    flat = _job([(4 << 10, 2e-3), (8 << 20, 1.9e-3)])
    monkeypatch.setattr(probe_module, "_run_job", lambda *a: runs.append(a) or flat)
    with pytest.raises(RuntimeError) as err:
        probe_module.probe(2, ("shm",), attempts=3)
    assert len(runs) == 3
    text = str(err.value)
    assert "probe over shm" in text and "too busy" in text and "8388608 bytes" in text
