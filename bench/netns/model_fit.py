"""The cost model's side: its numbers, its predictions, and the refit of a network link."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from ringreduce.bench import bus_factor
from ringreduce.model import CostModel, Link

from . import DTYPE, JUDGED_FROM
from .report import groups, size_text


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
        from ringreduce.model import fit
        from ringreduce.model.probe import probe

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


def build_model(hosts: int, local: int, gbps: float, params: dict[str, Any]) -> CostModel:
    """The CostModel of H hosts x L ranks joined by links of ``gbps`` Gbit/s."""
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


def model_columns(model: CostModel, size: int, algo: str) -> tuple[Any, dict[str, Any]]:
    """The model's prediction for one all_reduce and the row columns it fills."""
    pred = model.predict("all_reduce", size, algorithm=algo, dtype=DTYPE)
    return pred, {
        "model_algorithm": pred.algorithm,
        "model_time_us": pred.seconds * 1e6,
        "model_algbw_gbs": pred.algbw,
        "model_busbw_gbs": pred.algbw * bus_factor(model.ranks),
        "model_sent_gbs": pred.busbw,  # bytes one rank sends per second (model's busbw)
    }


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
            raise ValueError(f"--fit-below: at most {size_text(JUDGED_FROM)}, the judged sizes")
        params["fit_below"] = args.fit_below
        for config, rows in groups(report):
            probe = [r for r in rows if r["size"] < args.fit_below and r["measured_time_us"]]
            if len(probe) >= 2:
                key = (config["layout"], config["rate"], config["algo"])
                fitted[key] = fit_network_link(probe, params)
    for row in report["rows"]:
        key = (row["layout"], row["rate"], row["algo"])
        link = fitted.get(key)
        if link is not None:
            alpha, beta = link
            gbps = 8.0 / beta / 1e9 if beta > 0 else 1e30
            row_params = dict(params, alpha_us=alpha * 1e6, wire_efficiency=1.0)
            row["model_link_gbps"], row["model_link_alpha_us"] = gbps, alpha * 1e6
            model = build_model(row["hosts"], row["ranks_per_host"], gbps, row_params)
        else:
            model = build_model(row["hosts"], row["ranks_per_host"], row["rate_gbps"], params)
        row.update(model_columns(model, row["size"], row["algo"])[1])
        busbw, model_busbw = row["measured_busbw_gbs"], row["model_busbw_gbs"]
        row["ratio"] = busbw / model_busbw if busbw and model_busbw else None
