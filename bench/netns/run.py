"""Running ringreduce bench on the emulated hosts, and the plan of the runs."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringreduce.bench import default_iters, default_warmup

from . import DTYPE, JUDGED_FROM, PLACEMENTS, TOLERANCE
from .model_fit import build_model, model_columns, model_params
from .namespaces import MASTER_ADDR, Namespaces
from .report import model_line, render, write_json


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
                    write_json(out / "validate.json", report)
    report["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    write_json(out / "validate.json", report)
    render(report, out)
    return 1 if failed else 0


def _rows(
    config: dict[str, Any],
    measured: dict[int, dict[str, Any]],
    placement: str,
    params: dict[str, Any],
) -> list[dict[str, Any]]:
    """One report row per measured size: the bench's numbers beside the model's."""
    model = build_model(config["hosts"], config["ranks_per_host"], config["rate_gbps"], params)
    rows = []
    for size in sorted(measured):
        pred, columns = model_columns(model, size, config["algo"])
        got = measured[size]
        busbw, model_busbw = got[placement]["busbw_gbs"], columns["model_busbw_gbs"]
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
                **columns,
                link_bytes=link_bytes if model.hosts > 1 else 0.0,
                ratio=busbw / model_busbw if busbw and model_busbw else None,
            )
        )
    return rows


def dry_run(args: argparse.Namespace) -> int:
    """Prints the configurations, the model's numbers and the sweep's expected duration
    (the model's time for every call, plus start-up)."""
    params = model_params(args, max(local for _h, local in args.layouts))
    print(f"model: {model_line(params)}")
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
