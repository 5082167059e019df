"""``ringreduce model``: the cost model (:mod:`ringreduce.model`) on the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .. import _env
from ..bench.data import parse_size
from .cost import CostModel, _size, _time
from .fitting import Sample, fit
from .link import COLLECTIVES, DEFAULT_LINKS, Link, itemsize

__all__ = ["build_parser", "main"]

_EPILOG = """\
Sizes take suffixes K, M and G (powers of 1024). Examples:
  ringreduce model --params 7e9 --dtype float16 --ranks 8 --link-gbps 800 --compute-s 0.5
  ringreduce model --hosts 2 --ranks-per-host 2 --link-gbps 1 --size 64M
  ringreduce model --probe -n 4 --size 1K --size 16M --collective all
"""


def build_parser(prog: str = "ringreduce model") -> argparse.ArgumentParser:
    """The argument parser of ``ringreduce model``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Alpha-beta cost model of ringreduce's collectives: predicted time per "
        "call, which algorithm runs and why, and a training step's communication share.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("the step")
    g.add_argument("--params", type=float, help="model parameters (gradient elements), e.g. 7e9")
    g.add_argument("--grad-bytes", type=parse_size, help="gradient bytes, instead of --params")
    g.add_argument("--dtype", default="float32", help="gradient dtype (default: float32)")
    g.add_argument("--compute-s", type=float, help="forward + backward seconds per step")
    g.add_argument(
        "--backward-fraction",
        type=float,
        default=2.0 / 3.0,
        help="share of compute that is backward, which communication can overlap (default 2/3)",
    )
    g.add_argument("--bucket-mb", type=float, default=25.0, help="bucket size, MiB (default 25)")
    g.add_argument("--first-bucket-mb", type=float, default=1.0, help="first bucket, MiB (1)")
    g = p.add_argument_group("the job")
    g.add_argument("--ranks", type=int, help="N; alone: N hosts of one rank (own link each)")
    g.add_argument("--hosts", type=int, help="hosts H")
    g.add_argument("--ranks-per-host", type=int, help="ranks per host L")
    g.add_argument(
        "--transport",
        default="auto",
        choices=("auto", "shm", "tcp", "mpi"),
        help="auto: shm on a host, tcp between hosts (default)",
    )
    g = p.add_argument_group("given numbers (else probed, else assumed)")
    g.add_argument("--link-gbps", type=float, help="network link, Gbit/s per direction")
    g.add_argument("--alpha-us", type=float, help="network latency per step, microseconds")
    g.add_argument("--shm-gbs", type=float, help="shared memory, GB/s per rank")
    g.add_argument("--shm-alpha-us", type=float, help="shared-memory latency per step, us")
    g.add_argument("--reduce-gbs", type=float, help="reduction throughput, GB/s (default: free)")
    g.add_argument("--segment-bytes", type=parse_size, help="RINGREDUCE_SEGMENT_BYTES")
    g.add_argument("--small-bytes", type=parse_size, help="RINGREDUCE_SMALL_BYTES")
    g = p.add_argument_group("probe")
    g.add_argument("--probe", action="store_true", help="fit alpha/beta by timing local ranks")
    g.add_argument("-n", "--nprocs", type=int, default=2, help="probe ranks (default 2)")
    g.add_argument("--probe-transports", default="shm,tcp", help="default: shm,tcp")
    g = p.add_argument_group("output")
    g.add_argument("--size", action="append", type=parse_size, help="a call size (repeatable)")
    g.add_argument("--collective", default="all_reduce", help=f"{', '.join(COLLECTIVES)} or all")
    g.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    return p


def _topology(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[int, int]:
    hosts, local, ranks = args.hosts, args.ranks_per_host, args.ranks
    if hosts is None and local is None:
        if ranks is None:
            return (1, args.nprocs) if args.probe else (1, 2)
        return ranks, 1
    if hosts is None:
        hosts = ranks // local if ranks else 1
    if local is None:
        local = ranks // hosts if ranks else 1
    if hosts < 1 or local < 1 or (ranks is not None and ranks != hosts * local):
        parser.error(f"--ranks {ranks} is not --hosts x --ranks-per-host ({hosts} x {local})")
    return hosts, local


def main(argv: Sequence[str] | None = None, prog: str = "ringreduce model") -> int:
    """Entry point of ``ringreduce model``; returns the exit status."""
    parser = build_parser(prog)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        elem = itemsize(args.dtype)
    except ValueError as exc:
        parser.error(str(exc))
    collectives = COLLECTIVES if args.collective == "all" else (args.collective,)
    if any(c not in COLLECTIVES for c in collectives):
        parser.error(f"--collective: one of {', '.join(COLLECTIVES)} or all")
    hosts, local = _topology(args, parser)
    intra, inter = {
        "auto": ("shm", "tcp"),
        "shm": ("shm", "shm"),
        "tcp": ("tcp", "tcp"),
        "mpi": ("mpi", "mpi"),
    }[args.transport]
    if args.transport == "shm" and hosts > 1:
        parser.error("--transport shm runs on one host only")
    links: dict[str, Link] = {}
    source: dict[str, str] = {}
    reduce_gbs = args.reduce_gbs
    samples: list[Sample] = []
    if args.probe:
        from .probe import probe

        transports = [t for t in args.probe_transports.split(",") if t]
        print(f"# probing {args.nprocs} local ranks over {', '.join(transports)} ...", flush=True)
        try:
            samples = probe(args.nprocs, transports)
        except (RuntimeError, ValueError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
        fitted, fitted_reduce = fit(samples)
        links.update(fitted)
        source.update({k: "probed" for k in fitted})
        if reduce_gbs is None:
            reduce_gbs = fitted_reduce
    _given(links, source, inter, args.link_gbps, args.alpha_us, 8.0)
    _given(links, source, "shm", args.shm_gbs, args.shm_alpha_us, 1.0)
    try:
        # As the engine would run here: the arguments, else RINGREDUCE_SEGMENT_BYTES /
        # RINGREDUCE_SMALL_BYTES, else the engine's defaults.
        segment_bytes = args.segment_bytes or _env.segment_bytes()
        small_bytes = args.small_bytes if args.small_bytes is not None else _env.small_bytes()
    except ValueError as exc:
        parser.error(str(exc))
    model = CostModel(
        hosts=hosts,
        ranks_per_host=local,
        links=links,
        intra_link=intra,
        inter_link=inter,
        reduce_gbs=reduce_gbs,
        segment_bytes=segment_bytes,
        small_bytes=small_bytes,
    )
    report: dict[str, Any] = {"hosts": hosts, "ranks_per_host": local, "ranks": model.ranks}
    _print_model(model, source, args.reduce_gbs is not None)
    report["links"] = {
        k: {"alpha_s": model.link(k).alpha, "gbs": model.link(k).gbs, "source": source.get(k)}
        for k in model.link_kinds()
    }
    report["reduce_gbs"] = reduce_gbs
    if samples:
        report["probe"] = _print_probe(model, samples, links, reduce_gbs)
    grad = args.grad_bytes or (args.params * elem if args.params else None)
    if grad:
        report["step"] = _print_step(model, args, grad, elem)
    sizes = args.size or ([] if grad else [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20])
    if sizes:
        report["calls"] = _print_calls(model, collectives, sizes, args.dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _given(links, source, kind, rate, alpha_us, bits) -> None:
    """Applies --link-gbps/--alpha-us (bits=8) or --shm-gbs/--shm-alpha-us (bits=1)."""
    if rate is None and alpha_us is None:
        return
    base = links.get(kind, DEFAULT_LINKS.get(kind, Link(10e-6, 1e-9)))
    beta = base.beta if rate is None else bits / (rate * 1e9)
    alpha = base.alpha if alpha_us is None else alpha_us * 1e-6
    links[kind] = Link(alpha, beta)
    source[kind] = "given" if rate is not None and alpha_us is not None else "given/assumed"


def _print_model(model: CostModel, source: dict[str, str], reduce_given: bool) -> None:
    h, lo = model.hosts, model.ranks_per_host
    print("# time = steps x alpha + bytes per direction / bandwidth + reduced bytes / rate")
    print(
        f"job:       N = {model.ranks} ranks = {h} host{'s' * (h > 1)} x {lo} rank{'s' * (lo > 1)}"
    )
    used = model.link_kinds()
    for kind in used + tuple(k for k in sorted(source) if k not in used):
        link = model.link(kind)
        where = "between hosts" if kind == model.inter_link and h > 1 else "on a host"
        where = where if kind in used else "(not used)"
        print(
            f"link {kind:<4}  {where:<13}  {link.gbs * 8:9.4g} Gbit/s = {link.gbs:8.4g} GB/s, "
            f"alpha {link.alpha * 1e6:.3g} us/step  ({source.get(kind, 'assumed')})"
        )
    if model.reduce_gbs is None:
        print("reduction: free (not modelled; --reduce-gbs or --probe to include it)")
    else:
        how = "given" if reduce_given else "probed"
        print(f"reduction: {model.reduce_gbs:.3g} GB/s per rank ({how})")
    print()


def _print_probe(model: CostModel, samples, links, reduce_gbs) -> list[dict]:
    print("probe: measured (max over ranks, median of 3 rounds) vs the fitted model")
    print(f"  {'link':<5}{'collective':<12}{'size':>10}{'measured':>12}{'model':>12}{'error':>8}")
    rows = []
    for s in samples:
        m = CostModel(
            ranks_per_host=s.ranks,
            intra_link=s.link,
            links=links,
            reduce_gbs=reduce_gbs,
            segment_bytes=model.segment_bytes,
            small_bytes=model.small_bytes,
        )
        pred = m.predict(s.collective, s.nbytes).seconds
        err = (pred - s.seconds) / s.seconds
        print(
            f"  {s.link:<5}{s.collective:<12}{_size(s.nbytes):>10}{_time(s.seconds):>12}"
            f"{_time(pred):>12}{err:>+8.0%}"
        )
        rows.append(
            {
                "link": s.link,
                "collective": s.collective,
                "nbytes": s.nbytes,
                "ranks": s.ranks,
                "measured_s": s.seconds,
                "model_s": pred,
            }
        )
    print()
    return rows


def _print_step(model: CostModel, args: argparse.Namespace, grad: float, elem: int) -> dict:
    n = model.ranks
    what = f"{args.params:g} params x {elem} B ({args.dtype})" if args.params else "gradients"
    print(f"gradients: {what} = S = {grad / 1e9:.2f} GB")
    compute = args.compute_s
    st = model.step(
        grad,
        compute or 0.0,
        backward_fraction=args.backward_fraction,
        bucket_bytes=args.bucket_mb * (1 << 20),
        first_bucket_bytes=args.first_bucket_mb * (1 << 20),
    )
    choice = model.choose(grad)
    pred = model.predict("all_reduce", grad, choice.fastest)
    bw = model.link(st.link).gbs
    print(f"all_reduce of S over N = {n}: {choice.fastest}; {choice.reason}")
    print(f"bytes each rank sends (and receives) over its {st.link} link, at {bw:.4g} GB/s:")
    exact = st.ring_factor * grad
    print(
        f"  2(N-1)/N x S = {st.ring_factor:.3f} x {grad / 1e9:.2f} GB = {exact / 1e9:6.2f} GB"
        f"  -> {exact / 1e9:.2f} GB / {bw:.4g} GB/s = {exact / 1e9 / bw:.3f} s"
    )
    print(
        f"  2 x S (2(N-1)/N rounded to 2)   = {2 * grad / 1e9:6.2f} GB"
        f"  -> {2 * grad / 1e9:.2f} GB / {bw:.4g} GB/s = {st.rounded_comm_s:.3f} s"
    )
    steps = sum(p.steps for p in pred.phases)
    print(
        f"predicted all_reduce ({choice.fastest}, {steps:g} steps incl. header): {_s(pred.seconds)}"
    )
    out = {
        "grad_bytes": grad,
        "algorithm": choice.fastest,
        "bytes_per_rank": exact,
        "rounded_bytes_per_rank": 2 * grad,
        "all_reduce_s": st.comm_s,
        "rounded_all_reduce_s": st.rounded_comm_s,
    }
    if compute is None:
        print()
        return out
    print(
        f"\nstep: compute {compute:g} s, backward {st.backward_s:.3g} s of it; "
        f"buckets of {args.bucket_mb:g} MiB (first {args.first_bucket_mb:g}) reduced as backward "
        f"makes them ({_time(st.bucketed_comm_s)} in all, last {_time(st.last_bucket_s)})"
    )
    print(f"  {'':<34}{'model 2(N-1)/N':>16}{'rounded 2 x S':>15}")
    rows = [
        ("all_reduce of S", _s(st.comm_s), _s(st.rounded_comm_s)),
        ("step, no overlap", _s(compute + st.comm_s), _s(compute + st.rounded_comm_s)),
        ("communication share, no overlap", f"{st.fraction:.0%}", f"{st.rounded_fraction:.0%}"),
        ("exposed with overlap", _s(st.exposed_s), _s(st.rounded_exposed_s)),
        ("step with overlap", _s(compute + st.exposed_s), _s(compute + st.rounded_exposed_s)),
        (
            "communication share, overlap",
            f"{st.overlap_fraction:.0%}",
            f"{st.rounded_overlap_fraction:.0%}",
        ),
    ]
    for name, a, b in rows:
        print(f"  {name:<34}{a:>16}{b:>15}")
    print()
    out.update(
        compute_s=compute,
        fraction=st.fraction,
        rounded_fraction=st.rounded_fraction,
        exposed_s=st.exposed_s,
        overlap_fraction=st.overlap_fraction,
        rounded_overlap_fraction=st.rounded_overlap_fraction,
    )
    return out


def _s(seconds: float) -> str:
    """Seconds as the step table prints them: 0.245 s, 1.120 s."""
    return f"{seconds:.3f} s" if seconds >= 0.01 else _time(seconds)


def _print_calls(model: CostModel, collectives, sizes, dtype: str) -> list[dict]:
    print(
        f"{'collective':<15}{'size':>10}{'algorithm':>14}{'time':>12}{'algbw GB/s':>12}"
        f"{'busbw GB/s':>12}"
    )
    rows = []
    for c in collectives:
        for size in sizes:
            p = model.predict(c, size, dtype=dtype)
            print(
                f"{c:<15}{_size(size):>10}{p.algorithm:>14}{_time(p.seconds):>12}"
                f"{p.algbw:>12.3g}{p.busbw:>12.3g}"
            )
            rows.append(
                {
                    "collective": c,
                    "nbytes": size,
                    "algorithm": p.algorithm,
                    "seconds": p.seconds,
                    "algbw_gbs": p.algbw,
                    "busbw_gbs": p.busbw,
                }
            )
    if "all_reduce" in collectives:
        print("\nall_reduce algorithm, by size:")
        for size in sizes:
            choice = model.choose(size)
            print(f"  {_size(size)}: {choice.reason}")
            rows_for = [r for r in rows if r["collective"] == "all_reduce" and r["nbytes"] == size]
            for r in rows_for:
                r["fastest"] = choice.fastest
                r["why"] = choice.reason
    return rows
