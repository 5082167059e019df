"""Plots busbw against size for several `ringreduce bench --json` files on one chart.

    python bench/plot_runs.py tcp.json mpi.json -o allreduce.png

Our in-place rows come from every file (labelled with the file's transport);
the compared systems (MPI_Allreduce, Gloo) and the memcpy yardstick from the
first file only, since every run times them the same way.
"""

from __future__ import annotations

import argparse
import json

_NAMES = {
    "mpi": "MPI_Allreduce (mpi4py)",
    "gloo": "torch.distributed Gloo",
    "memcpy": "memcpy, 1 core (GB/s copied)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="JSON files from ringreduce bench --json")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ringreduce.bench.report import finish_busbw_plot

    fig, ax = plt.subplots(figsize=(7, 4.5))
    meta = None
    for i, path in enumerate(args.runs):
        with open(path) as f:
            run = json.load(f)
        meta = meta or run["meta"]
        series: dict = {}
        for r in run["rows"]:
            if r["placement"] not in ("in-place", "copy") or not r["busbw_gbs"]:
                continue
            if r["system"] == "ringreduce":
                label = f"ringreduce ({run['meta']['transport']})"
            elif i == 0:
                label = _NAMES.get(r["system"], r["system"])
            else:
                continue
            series.setdefault(label, []).append((r["size"], r["busbw_gbs"]))
        for label, pts in series.items():
            ax.plot(*zip(*sorted(pts)), marker="o", ms=3, label=label)
    finish_busbw_plot(
        fig,
        ax,
        args.output,
        ylabel="busbw (GB/s, 1e9), in place",
        title=f"all_reduce {meta['dtype']} {meta['op']}, {meta['ranks']} ranks, one host",
    )


if __name__ == "__main__":
    main()
