"""Options of bench/netns_validate.py, and its main()."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from . import DTYPE, ITEMSIZE, PLACEMENTS, WIRE_EFFICIENCY
from .report import render, write_json

DEFAULT_SIZES = "1M..256M"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(bit)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A byte count as ``ringreduce bench`` reads it (8, 256K, 64M, 1G: powers of 1024),
    refused in argparse's terms."""
    from ringreduce.bench import parse_size as bench_size  # only where a size is read

    try:
        return bench_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1M, 256M)") from None


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


def build_parser(description: Optional[str] = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description,
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
        help=f"A..B (powers of 2) or a comma list, e.g. 1M,4M (default {DEFAULT_SIZES})",
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


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None, doc: str = "") -> int:
    """Runs netns_validate.py; ``doc`` is the script's docstring, for --help."""
    parser = build_parser(doc.splitlines()[0] if doc else None)
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        out = Path(args.out or Path(args.from_json).parent)
        out.mkdir(parents=True, exist_ok=True)
        if args.remodel:
            from .model_fit import remodel  # the model: ringreduce from here on

            remodel(report, args)
            write_json(out / "validate.json", report)
        render(report, out)
        return 0
    if args.sizes is None:  # parsed only here: rendering a validate.json reads no sizes
        args.sizes = parse_sizes(DEFAULT_SIZES)
    unknown = [a for a in args.algos if a not in ("ring", "hierarchical")]
    if unknown:
        parser.error(f"--algos: ring or hierarchical, got {', '.join(unknown)}")
    if args.dry_run:
        from .run import dry_run

        return dry_run(args)
    if os.geteuid() != 0:
        parser.error("needs root for the network namespaces (or --from-json / --dry-run)")
    from .run import measure

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
