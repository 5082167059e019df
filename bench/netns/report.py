"""What a validation writes: validate.txt, validate.png and validate.json. Needs neither
root nor ringreduce, so that a validate.json renders anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from . import JUDGED_FROM, TOLERANCE


def size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def model_line(params: dict[str, Any]) -> str:
    shm = "free" if params["shm_gbs"] is None else f"{params['shm_gbs']:.3g} GB/s"
    red = "free" if params["reduce_gbs"] is None else f"{params['reduce_gbs']:.3g} GB/s"
    eff = params.get("wire_efficiency", 1.0)
    return (
        f"network link = the tbf rate x {eff:.4f} (TCP payload share of a frame), alpha "
        f"{params['alpha_us']:.3g} us/step "
        f"({params['alpha_source']}); shared memory {shm}, alpha "
        f"{params['shm_alpha_us']:.3g} us/step ({params['shm_source']}); reduction {red} "
        f"({params['reduce_source']}); segment {size_text(params['segment_bytes'])}, "
        f"small limit {size_text(params['small_bytes'])}"
    )


def groups(report: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every configuration with its rows, in the order they ran."""
    out = []
    for config in report["configs"]:
        key = (config["layout"], config["rate"], config["algo"])
        rows = [r for r in report["rows"] if (r["layout"], r["rate"], r["algo"]) == key]
        out.append((config, sorted(rows, key=lambda r: r["size"])))
    return out


def write_json(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


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
        f"# model: {model_line(meta['model'])}",
        f"# busbw: {meta['busbw']}; judged: |model/measured - 1| <= {tol:.0%} at sizes >= "
        f"{size_text(judged)}",
        "",
    ]
    verdicts = []
    for config, rows in groups(report):
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
                f"{size_text(meta['model']['fit_below'])}: "
                f"{rows[0]['model_link_gbps']:.3g} Gbit/s, "
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
                f"{size_text(r['size']):>9}  {_num(r['measured_busbw_gbs']):>19}  "
                f"{_num(r['model_busbw_gbs']):>16}  "
                f"{'-' if err is None else f'{err * 100:+.1f}':>22}  {ok:>11}"
            )
        if errors:
            worst = max(errors)
            inside = sum(e <= tol for e in errors)
            verdict = "within" if worst <= tol else "NOT within"
            summary = (
                f"summary: max |model/measured - 1| at >= {size_text(judged)}: {worst:.1%} "
                f"({inside}/{len(errors)} sizes within {tol:.0%}: {verdict})"
            )
        else:
            verdict = "not judged"
            summary = f"summary: no measured size >= {size_text(judged)}, not judged"
        last = rows[-1] if rows else {}
        if last.get("measured_busbw_gbs"):
            line = config["rate_gbps"] / 8
            summary += (
                f"; at {size_text(last['size'])} measured busbw is "
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
    drawn = [(c, rows) for c, rows in groups(report) if rows]
    if not drawn:
        return False
    layouts = list(dict.fromkeys(c["layout"] for c, _ in drawn))
    rates = list(dict.fromkeys(c["rate"] for c, _ in drawn))
    colour = {rate: f"C{i % 10}" for i, rate in enumerate(rates)}
    marker = {"ring": "o", "hierarchical": "^"}
    style = {"ring": "-", "hierarchical": "--"}
    fig, axes = plt.subplots(
        1, len(layouts), figsize=(6 * len(layouts), 4.8), squeeze=False, sharey=True
    )
    for ax, layout in zip(axes[0], layouts):
        algos = []
        for config, rows in drawn:
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
        for config in {c["rate"]: c for c, _ in drawn if c["layout"] == layout}.values():
            ax.axhline(config["rate_gbps"] / 8, color=colour[config["rate"]], linestyle=":")
        hosts, local = (int(x) for x in layout.split("x"))
        ax.set_title(f"{layout}: {hosts} hosts x {local} rank{'s' * (local > 1)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: size_text(v).replace(" ", "")))
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel("message size")
        ax.grid(True, which="both", alpha=0.3)
        handles = [
            Line2D([], [], color=colour[r], linewidth=6, label=f"{r} (line rate dotted)")
            for r in rates
            if any(c["layout"] == layout and c["rate"] == r for c, _ in drawn)
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
