#!/usr/bin/env python3
"""Checks ``ringreduce model`` against all_reduce busbw measured on emulated hosts.

For every layout (H hosts x L ranks), link rate and algorithm asked for, brings up H
network namespaces whose links are shaped to the rate (``bench/netns_hosts.sh``; root
only), runs ``python -m ringreduce bench`` there with RINGREDUCE_ALGORITHM forced to
``ring`` or ``hierarchical`` (ranks numbered host by host: rank r on host r // L), and
sets the measured busbw per size beside the cost model's prediction for the same job,
links and algorithm (``ringreduce.model``). The model is meant to be within 15% at
16 MiB and above.

    python bench/netns_validate.py --layouts 4x1,2x2 --rates 1gbit,2.5gbit,10gbit \\
        --sizes 1M..256M --iters 5 --warmup 2 --calibrate --out netns_validate
    python bench/netns_validate.py --from-json netns_validate/validate.json
    python bench/netns_validate.py --dry-run ...      # the plan and its expected duration

Writes, under --out: ``validate.json`` (one row per layout, rate, algorithm and size:
measured and model busbw, and their ratio measured / model), ``validate.txt`` (a table
per configuration and a summary line each), ``validate.png`` (busbw against size, one
panel per layout: measured dots, model lines, line rates dotted), and ``bench/`` (every
rank's output and rank 0's ``ringreduce bench --json``). ``--from-json`` only renders
the txt and png again from a validate.json, and needs neither root nor ringreduce.

Both sides use the bench's busbw, ``algbw x 2(N-1)/N`` with GB = 1e9 bytes, for the
hierarchical all_reduce too, so measured / model is the model's time over the measured
time. The network link of the model is the tbf rate times the share of each frame
that is TCP payload (``--wire-efficiency``, 1448/1514 at MTU 1500); its latency
(``--alpha-us``), the shared memory between the ranks of a host (``--shm-gbs``,
``--shm-alpha-us``) and the reduction throughput (``--reduce-gbs``) are given, else
fitted by the model's probe on local ranks (``--calibrate``, as ``ringreduce model
--probe``), else the model's defaults; validate.txt says which numbers the model used
and where each came from. ``--from-json ... --remodel --fit-below 16M`` instead
calibrates each configuration's network link on its own sizes below 16 MiB, as a short
probe of the job would, and predicts the sizes from 16 MiB up with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
NETNS_HOSTS = HERE / "netns_hosts.sh"
MASTER_ADDR = "10.231.0.1"  # rrhost0, as netns_hosts.sh numbers the hosts
JUDGED_FROM = 16 << 20  # the model is judged at this size and above
TOLERANCE = 0.15
# tbf counts whole Ethernet frames; TCP payload is 1448 of every 1514 bytes at MTU 1500
# (20 bytes of IP header, 32 of TCP with timestamps, 14 of Ethernet header).
WIRE_EFFICIENCY = 1448 / 1514
DTYPE, ITEMSIZE = "float32", 4
PLACEMENTS = ("in-place", "out-of-place")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(bit)\s*$", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# Options


def parse_size(text: str) -> int:
    """A byte count: 8, 256K, 64M, 1G (powers of 1024), as ``ringreduce bench`` reads it."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1M, 256M)")
    return int(float(m.group(1)) * 1024 ** "bkmgt".index(m.group(2).lower() or "b"))


def parse_sizes(text: str) -> list[int]:
    """Comma list of sizes and ranges; ``A..B`` is A, 2A, 4A, ... up to B."""
    sizes: set[int] = set()
    for item in filter(None, (s.strip() for s in text.split(","))):
        if ".." in item:
            lo, hi = (parse_size(s) for s in item.split("..", 1))
            if lo < 1 or hi < lo:
                raise argparse.ArgumentTypeError(f"empty size range {item!r}")
            size = lo
            while size <= hi:
                sizes.add(size)
                size *= 2
        else:
            sizes.add(parse_size(item))
    bad = [s for s in sizes if s < ITEMSIZE or s % ITEMSIZE]
    if not sizes or bad:
        raise argparse.ArgumentTypeError(
            f"sizes must be whole {DTYPE} arrays (multiples of {ITEMSIZE} B), got {text!r}"
        )
    return sorted(sizes)


def parse_rate(text: str) -> tuple[str, float]:
    """A tc rate (1gbit, 2.5gbit, 500mbit; SI units, kibit etc. binary) -> (text, Gbit/s)."""
    m = _RATE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a tc rate: {text!r} (examples: 1gbit, 2.5gbit)")
    power = "bkmgt".index(m.group(2).lower() or "b")
    base = 1024 if m.group(3) else 1000
    return text.strip().lower(), float(m.group(1)) * base**power / 1e9


def parse_layout(text: str) -> tuple[int, int]:
    """HxL: H hosts of L ranks each."""
    m = re.match(r"^\s*(\d+)\s*x\s*(\d+)\s*$", text, re.IGNORECASE)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1 or int(m.group(1)) > 250:
        raise argparse.ArgumentTypeError(f"a layout is HOSTSxRANKS, e.g. 2x2; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _comma(kind):
    return lambda text: [kind(s) for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Sizes take K, M and G (powers of 1024); rates are tc's (1gbit = 1e9 bit/s).",
    )
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--layouts",
        type=_comma(parse_layout),
        default="4x1,2x2",
        help="HOSTSxRANKS list (default 4x1,2x2)",
    )
    g.add_argument(
        "--rates",
        type=_comma(parse_rate),
        default="1gbit,2.5gbit,10gbit",
        help="tbf link rates (default 1gbit,2.5gbit,10gbit)",
    )
    g.add_argument(
        "--algos",
        type=_comma(str.strip),
        default="ring,hierarchical",
        help="RINGREDUCE_ALGORITHM values; hierarchical runs only on layouts of several "
        "hosts of several ranks (default ring,hierarchical)",
    )
    g.add_argument(
        "--sizes",
        type=parse_sizes,
        default="1M..256M",
        help="A..B (powers of 2) or a comma list, e.g. 1M,4M (default 1M..256M)",
    )
    g.add_argument("--iters", type=int, help="timed iterations (default: the bench's)")
    g.add_argument("--warmup", type=int, help="warm-up calls incl. the checked one (bench's)")
    g.add_argument("--rounds", type=int, default=3, help="timed rounds, median counts (3)")
    g.add_argument("--check", type=int, choices=(0, 1), default=1, help="check results (1)")
    g.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="in-place",
        help="which of the bench's columns is set against the model (default in-place)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        help="seconds for one configuration's bench before its ranks are killed "
        "(default: from the sizes and the rate, generously)",
    )
    g.add_argument(
        "--call-timeout", type=float, default=60.0, help="the bench's per-call timeout (60)"
    )
    g = p.add_argument_group("the model's numbers (else --calibrate, else the model's defaults)")
    g.add_argument("--alpha-us", type=float, help="network latency per step, us")
    g.add_argument("--shm-gbs", type=float, help="shared memory on a host, GB/s per rank")
    g.add_argument("--shm-alpha-us", type=float, help="shared-memory latency per step, us")
    g.add_argument("--reduce-gbs", type=float, help="reduction throughput, GB/s per rank")
    g.add_argument(
        "--wire-efficiency",
        type=float,
        default=WIRE_EFFICIENCY,
        help="share of the tbf rate that carries TCP payload (default %(default).4f: "
        "1448 payload bytes per 1514-byte frame, MTU 1500 with TCP timestamps; 1: the "
        "bare line rate)",
    )
    g.add_argument(
        "--calibrate",
        action="store_true",
        help="fit the shared-memory link and the reduction rate with the model's probe "
        "(ringreduce model --probe) on local ranks first",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "--out", help="output folder (default: netns_validate; with --from-json, the file's)"
    )
    g.add_argument("--from-json", metavar="PATH", help="only render txt and png from PATH")
    g.add_argument(
        "--fit-below",
        type=parse_size,
        metavar="SIZE",
        help="with --remodel: calibrate each configuration's network link (alpha, beta) "
        "on its own measured sizes below SIZE (at most 16M, so that every judged size "
        "is predicted, not fitted), as a short probe of the job would",
    )
    g.add_argument(
        "--remodel",
        action="store_true",
        help="with --from-json: recompute the model's columns with --wire-efficiency "
        "(and --alpha-us, --shm-gbs, --reduce-gbs if given)",
    )
    g.add_argument(
        "--dry-run", action="store_true", help="print the plan and its expected duration"
    )
    return p


# --------------------------------------------------------------------------------------
# The model


def model_params(args: argparse.Namespace, local_ranks: int) -> dict[str, Any]:
    """The numbers the model takes besides the tbf rate, and where each came from."""
    from ringreduce.model import DEFAULT_LINKS

    shm, tcp = DEFAULT_LINKS["shm"], DEFAULT_LINKS["tcp"]
    params: dict[str, Any] = {
        "alpha_us": tcp.alpha * 1e6,
        "alpha_source": "model default",
        "shm_gbs": shm.gbs,
        "shm_alpha_us": shm.alpha * 1e6,
        "shm_source": "model default",
        "reduce_gbs": None,
        "reduce_source": "model default",
        "segment_bytes": _env_int("RINGREDUCE_SEGMENT_BYTES", 128 << 10),
        "small_bytes": _env_int("RINGREDUCE_SMALL_BYTES", 64 << 10),
        "wire_efficiency": args.wire_efficiency,
    }
    if args.calibrate:
        from ringreduce._model_probe import probe
        from ringreduce.model import fit

        nprocs = max(2, local_ranks)
        print(f"# calibrating: the model's probe on {nprocs} local ranks over shm ...", flush=True)
        links, reduce_gbs = fit(probe(nprocs, ("shm",)))
        fitted = links["shm"]
        params.update(
            shm_gbs=fitted.gbs,
            shm_alpha_us=fitted.alpha * 1e6,
            shm_source=f"probed, {nprocs} local ranks",
            reduce_gbs=reduce_gbs,
            reduce_source=f"probed, {nprocs} local ranks"
            + ("" if reduce_gbs else ", found hidden"),
        )
    if args.alpha_us is not None:
        params.update(alpha_us=args.alpha_us, alpha_source="given")
    if args.shm_gbs is not None:
        params.update(shm_gbs=args.shm_gbs, shm_source="given")
    if args.shm_alpha_us is not None:
        params.update(shm_alpha_us=args.shm_alpha_us, shm_source="given")
    if args.reduce_gbs is not None:
        params.update(reduce_gbs=args.reduce_gbs, reduce_source="given")
    if params["shm_gbs"] is not None and math.isinf(params["shm_gbs"]):
        params["shm_gbs"] = None  # JSON has no inf; None reads as free
    return params


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else default


def build_model(hosts: int, local: int, gbps: float, params: dict[str, Any]):
    """The CostModel of H hosts x L ranks joined by links of ``gbps`` Gbit/s."""
    from ringreduce.model import CostModel, Link

    shm_beta = 0.0 if params["shm_gbs"] is None else 1.0 / (params["shm_gbs"] * 1e9)
    return CostModel(
        hosts=hosts,
        ranks_per_host=local,
        links={
            "tcp": Link.from_gbps(
                gbps * params.get("wire_efficiency", 1.0), alpha=params["alpha_us"] * 1e-6
            ),
            "shm": Link(params["shm_alpha_us"] * 1e-6, shm_beta),
        },
        intra_link="shm",
        inter_link="tcp",
        reduce_gbs=params["reduce_gbs"],
        segment_bytes=params["segment_bytes"],
        small_bytes=params["small_bytes"],
    )


def bus_factor(ranks: int) -> float:
    """busbw / algbw of all_reduce, the bench's: 2(N-1)/N."""
    return 2.0 * (ranks - 1) / ranks


# --------------------------------------------------------------------------------------
# Running the bench on emulated hosts


class Namespaces:
    """H emulated hosts at a rate (netns_hosts.sh up), taken down again on leaving."""

    def __init__(self, hosts: int, rate: str):
        self.hosts, self.rate, self.up = hosts, rate, False

    def __enter__(self) -> Namespaces:
        taken = [n for n in _netns_names() if n == "rrswitch" or n.startswith("rrhost")]
        if taken:
            raise RuntimeError(
                f"network namespaces {', '.join(taken)} exist already (another run?); "
                f"remove them with: {NETNS_HOSTS} down {max(4, len(taken))}"
            )
        self.up = True
        try:
            subprocess.run(
                [str(NETNS_HOSTS), "up", str(self.hosts), self.rate],
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=60,
            )
        except BaseException:
            self.__exit__()  # a partial bring-up is taken down too
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.up:
            subprocess.run([str(NETNS_HOSTS), "down", str(self.hosts)], timeout=60, check=False)
            self.up = False


def _netns_names() -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def size_batches(sizes: Sequence[int]) -> list[tuple[int, int, int]]:
    """The bench runs (-b, -e, -f) that cover ``sizes``: one where they are a geometric
    series of integer factor, else one per size."""
    if len(sizes) == 1:
        return [(sizes[0], sizes[0], 2)]
    factor = sizes[1] // sizes[0]
    if factor >= 2 and all(b == a * factor for a, b in zip(sizes, sizes[1:])):
        return [(sizes[0], sizes[-1], factor)]
    return [(s, s, 2) for s in sizes]


def calls_per_size(args: argparse.Namespace, size: int) -> int:
    """all_reduce calls the bench makes at one size (both placements)."""
    from ringreduce.bench import default_iters, default_warmup

    iters = args.iters or default_iters(size)
    warmup = args.warmup if args.warmup is not None else default_warmup(size)
    return 2 * (args.check + args.rounds * (max(warmup - 1, 0) + iters))


def default_timeout(args: argparse.Namespace, gbps: float) -> float:
    """A bound on one configuration's bench: every call at the slower of the link and
    0.1 GB/s moving 2 x S, three times over, plus a minute to start and connect."""
    floor = min(gbps / 8, 0.1) * 1e9
    work = sum(calls_per_size(args, s) * (2 * s / floor + 0.05) for s in args.sizes)
    return 60.0 + 3.0 * work


def run_bench(
    args: argparse.Namespace,
    hosts: int,
    local: int,
    rate: str,
    gbps: float,
    algo: str,
    raw: Path,
) -> tuple[dict[int, dict[str, Any]], str]:
    """Runs the bench on H x L ranks in the namespaces; returns rank 0's rows by size
    (ringreduce's only) and the transport it reported. Raises RuntimeError on failure."""
    n = hosts * local
    tag = f"{hosts}x{local}_{rate}_{algo}"
    timeout = args.timeout or default_timeout(args, gbps)
    deadline = time.monotonic() + timeout
    found: dict[int, dict[str, Any]] = {}
    transport = "?"
    for part, (lo, hi, factor) in enumerate(size_batches(args.sizes)):
        name = tag if len(size_batches(args.sizes)) == 1 else f"{tag}_{part}"
        result = raw / f"{name}.json"
        result.unlink(missing_ok=True)
        bench = ["-b", str(lo), "-e", str(hi), "-f", str(factor), "-d", DTYPE]
        bench += [
            "-r",
            str(args.rounds),
            "-c",
            str(args.check),
            "--timeout",
            str(args.call_timeout),
        ]
        if args.iters:
            bench += ["-i", str(args.iters)]
        if args.warmup is not None:
            bench += ["-w", str(args.warmup)]
        port = random.randint(20000, 39999)
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(n):
                cmd = ["ip", "netns", "exec", f"rrhost{rank // local}", "env"]
                cmd += [f"RANK={rank}", f"WORLD_SIZE={n}", f"MASTER_ADDR={MASTER_ADDR}"]
                cmd += [f"MASTER_PORT={port}", f"RINGREDUCE_ALGORITHM={algo}"]
                cmd += [sys.executable, "-m", "ringreduce", "bench", *bench]
                cmd += ["--json", str(result)] if rank == 0 else []
                with open(raw / f"{name}.rank{rank}.log", "w") as log:
                    procs.append(
                        subprocess.Popen(
                            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                        )
                    )
            _wait_all(procs, deadline, timeout, raw / f"{name}.rank*.log")
        finally:
            _stop(procs)
        with open(result) as f:
            data = json.load(f)
        transport = data["meta"].get("transport", "?")
        for row in data["rows"]:
            if row["system"] == "ringreduce" and row["size"] in args.sizes:
                found.setdefault(row["size"], {})[row["placement"]] = row
    missing = [s for s in args.sizes if s not in found]
    if missing:
        raise RuntimeError(f"the bench gave no rows for sizes {missing}")
    return found, transport


def _wait_all(procs: list[subprocess.Popen], deadline: float, timeout: float, logs: Path) -> None:
    """Waits for every rank; the first failure or the deadline stops them all."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            rank, code = bad[0]
            raise RuntimeError(f"rank {rank} exited with {code} (see {logs})")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s (see {logs}; --timeout)")
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Ends the ranks still running (each leads its own process group), TERM then KILL."""
    live = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 5
        while time.monotonic() < end and any(p.poll() is None for p in live):
            time.sleep(0.1)
        live = [p for p in live if p.poll() is None]
        if not live:
            return


def plan(args: argparse.Namespace) -> list[tuple[int, int, str, float, str]]:
    """(hosts, ranks per host, rate, Gbit/s, algorithm) of every configuration to run."""
    out = []
    for hosts, local in args.layouts:
        for rate, gbps in args.rates:
            for algo in args.algos:
                if algo == "hierarchical" and (hosts == 1 or local == 1):
                    continue  # the engine runs the ring there; nothing new to measure
                out.append((hosts, local, rate, gbps, algo))
    return out


def measure(args: argparse.Namespace) -> int:
    """Runs every configuration, writing validate.json after each; returns the exit status."""
    out = Path(args.out or "netns_validate")
    raw = out / "bench"
    raw.mkdir(parents=True, exist_ok=True)
    configs = plan(args)
    params = model_params(args, max(local for _h, local in args.layouts))
    report: dict[str, Any] = {
        "meta": {
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "dtype": DTYPE,
            "op": "sum",
            "iters": args.iters,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "placement": args.placement,
            "judged_from_bytes": JUDGED_FROM,
            "tolerance": TOLERANCE,
            "busbw": "algbw x 2(N-1)/N, GB = 1e9 bytes, measured and model alike",
            "model": params,
        },
        "configs": [],
        "rows": [],
    }
    failed = 0
    for hosts, local in dict.fromkeys(args.layouts):
        for rate, gbps in args.rates:
            todo = [c for c in configs if c[:3] == (hosts, local, rate)]
            if not todo:
                continue
            with Namespaces(hosts, rate):
                for _h, _l, _r, _g, algo in todo:
                    label = f"{hosts}x{local} {rate} {algo}"
                    print(f"# {label} ...", flush=True)
                    start = time.monotonic()
                    config = {
                        "layout": f"{hosts}x{local}",
                        "hosts": hosts,
                        "ranks_per_host": local,
                        "rate": rate,
                        "rate_gbps": gbps,
                        "algo": algo,
                    }
                    try:
                        rows, transport = run_bench(args, hosts, local, rate, gbps, algo, raw)
                    except (RuntimeError, OSError, ValueError, KeyError) as exc:
                        failed += 1
                        config["error"] = str(exc)
                        print(f"#   failed: {exc}", file=sys.stderr, flush=True)
                    else:
                        config["transport"] = transport
                        report["rows"] += _rows(config, rows, args.placement, params)
                    config["seconds"] = round(time.monotonic() - start, 1)
                    report["configs"].append(config)
                    _write_json(out / "validate.json", report)
    report["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    _write_json(out / "validate.json", report)
    render(report, out)
    return 1 if failed else 0


def _rows(
    config: dict[str, Any],
    measured: dict[int, dict[str, Any]],
    placement: str,
    params: dict[str, Any],
) -> list[dict[str, Any]]:
    model = build_model(config["hosts"], config["ranks_per_host"], config["rate_gbps"], params)
    factor = bus_factor(model.ranks)
    rows = []
    for size in sorted(measured):
        pred = model.predict("all_reduce", size, algorithm=config["algo"], dtype=DTYPE)
        got = measured[size]
        busbw = got[placement]["busbw_gbs"]
        model_busbw = pred.algbw * factor
        # Bytes each host's network link carries per direction in one call.
        link_bytes = sum(p.wire_bytes for p in pred.phases if p.link == model.inter_link)
        rows.append(
            dict(
                config,
                size=size,
                placement=placement,
                measured_busbw_gbs=busbw,
                measured_algbw_gbs=got[placement]["algbw_gbs"],
                measured_time_us=got[placement]["time_us"],
                **{
                    f"{p.replace('-', '_')}_busbw_gbs": got[p]["busbw_gbs"]
                    for p in PLACEMENTS
                    if p in got
                },
                wrong=sum(got[p].get("wrong") or 0 for p in PLACEMENTS if p in got),
                model_algorithm=pred.algorithm,
                model_time_us=pred.seconds * 1e6,
                model_algbw_gbs=pred.algbw,
                model_busbw_gbs=model_busbw,
                model_sent_gbs=pred.busbw,  # bytes one rank sends per second (model's busbw)
                link_bytes=link_bytes if model.hosts > 1 else 0.0,
                ratio=busbw / model_busbw if busbw and model_busbw else None,
            )
        )
    return rows


def fit_network_link(rows: list[dict[str, Any]], params: dict[str, Any]) -> tuple[float, float]:
    """(alpha s, beta s/byte) of the network link that best explains the measured times
    of ``rows`` (one configuration), the rest of the model as ``params`` says: least
    squares on relative error, both >= 0."""
    import numpy as np

    a, y = [], []
    for row in rows:
        # A network link far slower than shared memory, so that every phase it takes
        # part in is costed on it (a ring phase goes at its slowest link's pace).
        bare = dict(params, alpha_us=0.0, wire_efficiency=1.0)
        model = build_model(row["hosts"], row["ranks_per_host"], 1e-9, bare)
        pred = model.predict("all_reduce", row["size"], algorithm=row["algo"], dtype=DTYPE)
        net = [p for p in pred.phases if p.link == model.inter_link]
        fixed = sum(p.seconds(model) for p in pred.phases if p.link != model.inter_link)
        seconds = row["measured_time_us"] * 1e-6
        a.append([sum(p.steps for p in net) / seconds, sum(p.wire_bytes for p in net) / seconds])
        y.append(1.0 - fixed / seconds)
    a_, y_ = np.array(a), np.array(y)
    best, best_x = math.inf, np.zeros(2)
    for cols in ([0], [1], [0, 1]):
        sub, *_ = np.linalg.lstsq(a_[:, cols], y_, rcond=None)
        if np.any(sub < 0):
            continue
        x = np.zeros(2)
        x[cols] = sub
        residual = float(np.sum((a_ @ x - y_) ** 2))
        if residual < best:
            best, best_x = residual, x
    return float(best_x[0]), float(best_x[1])


def remodel(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Recomputes the model's columns of every row with the numbers given now."""
    params = report["meta"]["model"]
    params["wire_efficiency"] = args.wire_efficiency
    for key, source in (("alpha_us", "alpha"), ("shm_gbs", "shm"), ("reduce_gbs", "reduce")):
        value = getattr(args, key)
        if value is not None:
            params[key], params[f"{source}_source"] = value, "given"
    fitted: dict[tuple, tuple[float, float]] = {}
    if args.fit_below:
        if args.fit_below > JUDGED_FROM:
            raise ValueError(f"--fit-below: at most {_size(JUDGED_FROM)}, the judged sizes")
        params["fit_below"] = args.fit_below
        for config, rows in _groups(report):
            probe = [r for r in rows if r["size"] < args.fit_below and r["measured_time_us"]]
            if len(probe) >= 2:
                key = (config["layout"], config["rate"], config["algo"])
                fitted[key] = fit_network_link(probe, params)
    for row in report["rows"]:
        key = (row["layout"], row["rate"], row["algo"])
        link = fitted.get(key)
        row_params = params
        if link is not None:
            alpha, beta = link
            gbps = 8.0 / beta / 1e9 if beta > 0 else 1e30
            row_params = dict(params, alpha_us=alpha * 1e6, wire_efficiency=1.0)
            row["model_link_gbps"], row["model_link_alpha_us"] = gbps, alpha * 1e6
            model = build_model(row["hosts"], row["ranks_per_host"], gbps, row_params)
        else:
            model = build_model(row["hosts"], row["ranks_per_host"], row["rate_gbps"], params)
        pred = model.predict("all_reduce", row["size"], algorithm=row["algo"], dtype=DTYPE)
        row.update(
            model_algorithm=pred.algorithm,
            model_time_us=pred.seconds * 1e6,
            model_algbw_gbs=pred.algbw,
            model_busbw_gbs=pred.algbw * bus_factor(model.ranks),
            model_sent_gbs=pred.busbw,
        )
        busbw, model_busbw = row["measured_busbw_gbs"], row["model_busbw_gbs"]
        row["ratio"] = busbw / model_busbw if busbw and model_busbw else None


def _write_json(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def dry_run(args: argparse.Namespace) -> int:
    """Prints the configurations, the model's numbers and the sweep's expected duration
    (the model's time for every call, plus start-up)."""
    params = model_params(args, max(local for _h, local in args.layouts))
    print(f"model: {_model_line(params)}")
    total = 0.0
    for hosts, local, rate, gbps, algo in plan(args):
        model = build_model(hosts, local, gbps, params)
        seconds = sum(
            calls_per_size(args, s) * model.predict("all_reduce", s, algo, DTYPE).seconds
            for s in args.sizes
        )
        seconds += 5.0 * len(size_batches(args.sizes))
        total += seconds
        print(
            f"{hosts}x{local} {rate:>8} {algo:<13} about {seconds / 60:5.1f} min "
            f"(timeout {(args.timeout or default_timeout(args, gbps)) / 60:.0f} min)"
        )
    print(f"all: about {total / 60:.0f} min at the model's speed (longer where it is slower)")
    return 0


# --------------------------------------------------------------------------------------
# Rendering


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _model_line(params: dict[str, Any]) -> str:
    shm = "free" if params["shm_gbs"] is None else f"{params['shm_gbs']:.3g} GB/s"
    red = "free" if params["reduce_gbs"] is None else f"{params['reduce_gbs']:.3g} GB/s"
    eff = params.get("wire_efficiency", 1.0)
    return (
        f"network link = the tbf rate x {eff:.4f} (TCP payload share of a frame), alpha "
        f"{params['alpha_us']:.3g} us/step "
        f"({params['alpha_source']}); shared memory {shm}, alpha "
        f"{params['shm_alpha_us']:.3g} us/step ({params['shm_source']}); reduction {red} "
        f"({params['reduce_source']}); segment {_size(params['segment_bytes'])}, "
        f"small limit {_size(params['small_bytes'])}"
    )


def _groups(report: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every configuration with its rows, in the order they ran."""
    out = []
    for config in report["configs"]:
        key = (config["layout"], config["rate"], config["algo"])
        rows = [r for r in report["rows"] if (r["layout"], r["rate"], r["algo"]) == key]
        out.append((config, sorted(rows, key=lambda r: r["size"])))
    return out


def render_text(report: dict[str, Any]) -> str:
    meta = report["meta"]
    tol = meta.get("tolerance", TOLERANCE)
    judged = meta.get("judged_from_bytes", JUDGED_FROM)
    runs = lambda v: "bench default" if v is None else v  # noqa: E731
    lines = [
        "# ringreduce model vs all_reduce measured on emulated hosts (bench/netns_validate.py)",
        f"# command: {' '.join(meta.get('command', []))}",
        f"# measured: ringreduce bench, {meta['placement']}, {meta['dtype']} {meta['op']}, "
        f"iters {runs(meta['iters'])}, warmup {runs(meta['warmup'])}, rounds {meta['rounds']} "
        f"(median); started {meta.get('started', '?')}",
        f"# model: {_model_line(meta['model'])}",
        f"# busbw: {meta['busbw']}; judged: |model/measured - 1| <= {tol:.0%} at sizes >= "
        f"{_size(judged)}",
        "",
    ]
    verdicts = []
    for config, rows in _groups(report):
        hosts, local = config["hosts"], config["ranks_per_host"]
        head = (
            f"== {config['layout']} ({hosts} host{'s' * (hosts > 1)} x {local} "
            f"rank{'s' * (local > 1)}), {config['rate']} links, "
            f"RINGREDUCE_ALGORITHM={config['algo']}"
        )
        if "error" in config:
            lines += [head, f"FAILED: {config['error']}", ""]
            verdicts.append(f"{config['layout']} {config['rate']} {config['algo']}: failed")
            continue
        lines.append(f"{head}, transport {config.get('transport', '?')}")
        if rows and "model_link_gbps" in rows[0]:
            lines.append(
                f"model's network link fitted on the sizes below "
                f"{_size(meta['model']['fit_below'])}: {rows[0]['model_link_gbps']:.3g} Gbit/s, "
                f"alpha {rows[0]['model_link_alpha_us']:.3g} us/step"
            )
        lines.append(
            f"{'size':>9}  {'measured busbw GB/s':>19}  {'model busbw GB/s':>16}  "
            f"{'model/measured - 1 (%)':>22}  {'within 15%?':>11}"
        )
        errors = []
        for r in rows:
            err = _error(r)
            ok = "-"
            if r["size"] >= judged and err is not None:
                errors.append(abs(err))
                ok = "yes" if abs(err) <= tol else "NO"
            lines.append(
                f"{_size(r['size']):>9}  {_num(r['measured_busbw_gbs']):>19}  "
                f"{_num(r['model_busbw_gbs']):>16}  "
                f"{'-' if err is None else f'{err * 100:+.1f}':>22}  {ok:>11}"
            )
        if errors:
            worst = max(errors)
            inside = sum(e <= tol for e in errors)
            verdict = "within" if worst <= tol else "NOT within"
            summary = (
                f"summary: max |model/measured - 1| at >= {_size(judged)}: {worst:.1%} "
                f"({inside}/{len(errors)} sizes within {tol:.0%}: {verdict})"
            )
        else:
            verdict = "not judged"
            summary = f"summary: no measured size >= {_size(judged)}, not judged"
        last = rows[-1] if rows else {}
        if last.get("measured_busbw_gbs"):
            line = config["rate_gbps"] / 8
            summary += (
                f"; at {_size(last['size'])} measured busbw is "
                f"{last['measured_busbw_gbs'] / line:.0%} of the line rate ({line:.4g} GB/s)"
            )
            if last.get("link_bytes") and last.get("measured_time_us"):
                busy = last["link_bytes"] / (last["measured_time_us"] * 1e-6) / 1e9 / line
                summary += f", and each host's link carries {busy:.0%} of it"
        lines += [summary, ""]
        worst_text = f", max error {max(errors):.1%}" if errors else ""
        verdicts.append(
            f"{config['layout']} {config['rate']} {config['algo']}: {verdict}{worst_text}"
        )
    lines.append("overall:")
    lines += [f"  {v}" for v in verdicts]
    return "\n".join(lines) + "\n"


def _error(row: dict[str, Any]) -> Optional[float]:
    """model/measured - 1 of one row."""
    got, want = row.get("measured_busbw_gbs"), row.get("model_busbw_gbs")
    return want / got - 1 if got and want else None


def _num(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def render_plot(report: dict[str, Any], path: Path) -> bool:
    """busbw against size, one panel per layout; False where matplotlib is missing or
    nothing was measured."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return False
    groups = [(c, rows) for c, rows in _groups(report) if rows]
    if not groups:
        return False
    layouts = list(dict.fromkeys(c["layout"] for c, _ in groups))
    rates = list(dict.fromkeys(c["rate"] for c, _ in groups))
    colour = {rate: f"C{i % 10}" for i, rate in enumerate(rates)}
    marker = {"ring": "o", "hierarchical": "^"}
    style = {"ring": "-", "hierarchical": "--"}
    fig, axes = plt.subplots(
        1, len(layouts), figsize=(6 * len(layouts), 4.8), squeeze=False, sharey=True
    )
    for ax, layout in zip(axes[0], layouts):
        algos = []
        for config, rows in groups:
            if config["layout"] != layout:
                continue
            algo, c = config["algo"], colour[config["rate"]]
            algos.append(algo)
            sizes = [r["size"] for r in rows]
            ax.plot(
                sizes,
                [r["model_busbw_gbs"] for r in rows],
                linestyle=style.get(algo, ":"),
                color=c,
                linewidth=1.3,
            )
            measured = [(r["size"], r["measured_busbw_gbs"]) for r in rows]
            ax.plot(
                *zip(*[m for m in measured if m[1]]),
                linestyle="none",
                marker=marker.get(algo, "s"),
                color=c,
                markersize=5,
            )
        for config in {c["rate"]: c for c, _ in groups if c["layout"] == layout}.values():
            ax.axhline(config["rate_gbps"] / 8, color=colour[config["rate"]], linestyle=":")
        hosts, local = (int(x) for x in layout.split("x"))
        ax.set_title(f"{layout}: {hosts} hosts x {local} rank{'s' * (local > 1)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _size(v).replace(" ", "")))
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel("message size")
        ax.grid(True, which="both", alpha=0.3)
        handles = [
            Line2D([], [], color=colour[r], linewidth=6, label=f"{r} (line rate dotted)")
            for r in rates
            if any(c["layout"] == layout and c["rate"] == r for c, _ in groups)
        ]
        for algo in dict.fromkeys(algos):
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.3",
                    linestyle="none",
                    marker=marker.get(algo, "s"),
                    label=f"{algo}, measured",
                )
            )
            handles.append(
                Line2D([], [], color="0.3", linestyle=style.get(algo, ":"), label=f"{algo}, model")
            )
        ax.legend(handles=handles, fontsize=8, loc="best")
    axes[0][0].set_ylabel(f"busbw (GB/s, 1e9), {report['meta']['placement']}")
    fig.suptitle("all_reduce on emulated hosts (tbf links): measured vs ringreduce model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def render(report: dict[str, Any], out: Path) -> None:
    text = render_text(report)
    (out / "validate.txt").write_text(text)
    print(text, end="")
    plotted = render_plot(report, out / "validate.png")
    print(f"# wrote {out / 'validate.txt'}" + (f", {out / 'validate.png'}" if plotted else ""))
    if not plotted:
        print("# no plot: nothing measured, or no matplotlib (pip install matplotlib)")


# --------------------------------------------------------------------------------------


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        out = Path(args.out or Path(args.from_json).parent)
        out.mkdir(parents=True, exist_ok=True)
        if args.remodel:
            remodel(report, args)
            _write_json(out / "validate.json", report)
        render(report, out)
        return 0
    unknown = [a for a in args.algos if a not in ("ring", "hierarchical")]
    if unknown:
        parser.error(f"--algos: ring or hierarchical, got {', '.join(unknown)}")
    if args.dry_run:
        return dry_run(args)
    if os.geteuid() != 0:
        parser.error("needs root for the network namespaces (or --from-json / --dry-run)")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        return measure(args)
    except KeyboardInterrupt:
        print("\n# interrupted; namespaces taken down", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError, OSError, subprocess.SubprocessError) as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
