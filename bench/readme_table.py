"""The README's performance table, from bench/perf_readme.sh's results.

    python bench/readme_table.py docs/perf

Reads n{2,4}_shm.json and n{2,4}_tcp.json (ringreduce bench --json) and, where
present, imb_n{2,4}.txt (bench/imb_allreduce.sh); prints a markdown table of busbw
(GB/s) and times side by side, ours on numpy arrays and, where the sweep timed it
(--compare window), on comm.empty arrays. Intel MPI's times come from its own C benchmark, run
after ours on the same host: a comparison across runs, not interleaved like the rest.
Where perf_readme.sh made several sweeps (files with .sweepK before the suffix), each
figure is its median over the sweeps.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

SIZES = [8, 2048, 65536, 1 << 20, 16 << 20, 64 << 20]


def sweeps(path: Path) -> list:
    """The files of every sweep of ``path``: itself, then its .sweepK siblings."""
    extra = sorted(path.parent.glob(f"{path.stem}.sweep*{path.suffix}"))
    return [p for p in [path, *extra] if p.exists()]


def rows(path: Path) -> dict:
    """(system, placement, size) -> row, its times and bandwidths the median over the
    sweeps that measured it."""
    per_key: dict = {}
    for p in sweeps(path):
        for r in json.loads(p.read_text())["rows"]:
            per_key.setdefault((r["system"], r["placement"], r["size"]), []).append(r)
    return {
        key: {f: statistics.median(r[f] for r in rs) for f in ("time_us", "algbw_gbs", "busbw_gbs")}
        for key, rs in per_key.items()
    }


def imb(path: Path) -> dict:
    """size -> t_avg in us (the median over the sweeps)."""
    times: dict = {}
    for p in sweeps(path):
        for line in p.read_text().splitlines():
            if line and not line.startswith("#"):
                size, t = line.split()
                times.setdefault(int(size), []).append(float(t))
    return {size: statistics.median(ts) for size, ts in times.items()}


def label(size: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def fmt(t: float) -> str:
    return f"{t:.3g}" if t < 1000 else f"{t:,.0f}"


def main(argv: list) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs/perf")
    print(
        "| size | ranks | ours, shm (us) | MPI_Allreduce | Gloo | Intel MPI (C) "
        "| ours/Intel | ours busbw | ours/memcpy | ours, TCP/Gloo | ours, windows (us) "
        "| windows/Intel |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (2, 4):
        shm, tcp, intel = (
            rows(out / f"n{n}_shm.json"),
            rows(out / f"n{n}_tcp.json"),
            imb(out / f"imb_n{n}.txt"),
        )
        for size in SIZES:
            ours = shm.get(("ringreduce", "out-of-place", size))
            if ours is None:
                continue
            mpi = shm.get(("mpi", "in-place", size))
            gloo = shm.get(("gloo", "in-place", size))
            memcpy = shm.get(("memcpy", "copy", size))
            window = shm.get(("window", "out-of-place", size))
            tcp_ours, tcp_gloo = (
                tcp.get((s, p, size))
                for s, p in (("ringreduce", "out-of-place"), ("gloo", "in-place"))
            )
            t = ours["time_us"]
            cells = [
                label(size),
                str(n),
                fmt(t),
                fmt(mpi["time_us"]) if mpi else "-",
                fmt(gloo["time_us"]) if gloo else "-",
                fmt(intel[size]) if size in intel else "-",
                f"{t / intel[size]:.2f}" if size in intel else "-",
                f"{ours['busbw_gbs']:.3g}",
                f"{ours['algbw_gbs'] / memcpy['algbw_gbs']:.2f}" if memcpy else "-",
                f"{tcp_gloo['time_us'] / tcp_ours['time_us']:.2f}x"
                if tcp_ours and tcp_gloo
                else "-",
                fmt(window["time_us"]) if window else "-",
                f"{window['time_us'] / intel[size]:.2f}" if window and size in intel else "-",
            ]
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
