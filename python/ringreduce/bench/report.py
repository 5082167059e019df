"""Output of ``ringreduce bench`` on rank 0: the nccl-tests style table, its footer, and
the --json, --csv and --plot files."""

from __future__ import annotations

import csv
import json
import math
import sys
from typing import Any

Row = dict[str, Any]

__all__ = ["Header", "Row", "fmt_time", "footer", "mean", "ratio", "write_outputs"]


def ratio(ours: float | None, theirs: float) -> float:
    """ours / theirs, or NaN where either is unknown."""
    if ours is None or not theirs or math.isnan(theirs):
        return math.nan
    return ours / theirs


def fmt_time(us: float) -> str:
    """A time in microseconds for the table."""
    if math.isnan(us):
        return "nan"
    # nccl-tests' precision: fewer decimals as times grow, so columns keep their width.
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 100 else f"{us:.2f}"


class Header:
    """Column layout: our out-of-place and in-place blocks, the memcpy yardstick, then one
    block per peer."""

    def __init__(self, dtype: str, op: str, peers: list[Any]):
        self.dtype = dtype
        self.op = op
        self.peers = [f"{p.name} ({p.placement})" for p in peers]

    def print(self) -> None:
        """Prints the three '#' header lines (block titles, column names, units)."""
        lead = f"{'':>12}  {'':>12}  {'':>8}  {'':>6}"
        block = f"  {'time':>10}  {'algbw':>7}  {'busbw':>7}  {'#wrong':>6}"
        unit = f"  {'(us)':>10}  {'(GB/s)':>7}  {'(GB/s)':>7}  {'':>6}"
        peer = f"  {'time':>10}  {'busbw':>7}  {'ours/':>6}"
        peer_unit = f"  {'(us)':>10}  {'(GB/s)':>7}  {'theirs':>6}"
        copy = f"  {'memcpy':>7}  {'busbw/':>6}"
        copy_unit = f"  {'(GB/s)':>7}  {'memcpy':>6}"
        titles = f"{'out-of-place':^42}{'in-place':^42}{'1 core':^17}" + "".join(
            f"{p:^33}" for p in self.peers
        )
        names = f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}{block}{block}{copy}"
        units = f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}{unit}{unit}{copy_unit}"
        for line in (
            f"# {lead[2:]}{titles}",
            names + peer * len(self.peers),
            units + peer_unit * len(self.peers),
        ):
            print(line.rstrip())

    def row(self, rows: list[Row], check: int) -> str:
        """One table line from one size's rows (ours first, then the peers')."""
        first = rows[0]
        text = f"{first['size']:>12}  {first['count']:>12}  {self.dtype:>8}  {self.op:>6}"
        for r in rows:
            if r["system"] == "memcpy":
                text += f"  {r['busbw_gbs']:>7.2f}  {r['ratio_ours']:>6.2f}"
                continue
            text += f"  {fmt_time(r['time_us']):>10}"
            if r["system"] == "ringreduce":
                wrong = "N/A" if not check else str(r["wrong"])
                text += f"  {r['algbw_gbs']:>7.2f}  {r['busbw_gbs']:>7.2f}  {wrong:>6}"
            else:
                # Ratios span decades at small sizes; keep 3 significant digits.
                text += f"  {r['busbw_gbs']:>7.2f}  {r['ratio_ours']:>6.3g}"
        return text


def footer(rows: list[Row], wrong: int, check: int, peers: list[str]) -> None:
    """Prints the #wrong verdict and the average bus bandwidths, as nccl-tests does."""
    ours = [r["busbw_gbs"] for r in rows if r["system"] == "ringreduce"]
    if check:
        print(f"# #wrong total (ringreduce) : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {mean(ours):.6g}")
    for name in peers:
        theirs_rows = [r for r in rows if r["system"] == name]
        theirs = mean([r["busbw_gbs"] for r in theirs_rows])
        if math.isnan(theirs):
            print(f"# Avg bus bandwidth {name:<5}: n/a (failed, see notes)")
            continue
        placement = theirs_rows[0]["placement"]
        ours = mean(
            [
                r["busbw_gbs"]
                for r in rows
                if r["system"] == "ringreduce" and r["placement"] == placement
            ]
        )
        print(
            f"# Avg bus bandwidth {name:<5}: {theirs:.6g}   "
            f"(ours {placement} {ours:.6g}, ratio ours/{name} {ratio(ours, theirs):.3g})"
        )
    print("#")
    sys.stdout.flush()


def mean(values: list[float]) -> float:
    """Mean of the non-NaN values (NaN if there are none)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


_FIELDS = [
    "system",
    "placement",
    "size",
    "count",
    "dtype",
    "op",
    "ranks",
    "warmup",
    "iters",
    "time_us",
    "algbw_gbs",
    "busbw_gbs",
    "wrong",
    "ratio_ours",
]


def write_outputs(
    rows: list[Row],
    meta: dict[str, Any],
    *,
    json_path: str | None = None,
    csv_path: str | None = None,
    plot_path: str | None = None,
) -> None:
    """Writes the rows (one per system, placement and size) to the requested files."""
    if json_path:
        with open(json_path, "w") as f:
            # NaN is not JSON; a system that failed at a size gets null there.
            clean = [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                for r in rows
            ]
            json.dump({"meta": meta, "rows": clean}, f, indent=1)
            f.write("\n")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=_FIELDS, restval="")
            writer.writeheader()
            for r in rows:
                writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in _FIELDS})
    if plot_path:
        _plot(plot_path, rows, meta)


def _plot(path: str, rows: list[Row], meta: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display on a cluster node
        import matplotlib.pyplot as plt
    except ImportError:
        print("# note: --plot needs matplotlib (pip install matplotlib); no plot written")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        series.setdefault((r["system"], r["placement"]), []).append(r)
    for (system, placement), rs in series.items():
        label = system if system != "ringreduce" else f"ringreduce/{meta['transport']}"
        pts = [(r["size"], r["busbw_gbs"]) for r in rs if r["busbw_gbs"] > 0]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, label=f"{label} {placement}")
    finish_busbw_plot(
        fig,
        ax,
        path,
        ylabel="busbw (GB/s, 1e9)",
        title=f"all_reduce {meta['dtype']} {meta['op']}, {meta['ranks']} ranks",
    )
    plt.close(fig)


def finish_busbw_plot(fig: Any, ax: Any, path: str, *, ylabel: str, title: str) -> None:
    """Log axes, labels, grid and legend of a busbw-against-size chart; saves it to path."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
