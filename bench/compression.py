"""Compressed all_reduce, measured: effective bandwidth per codec against the fp32 ring,
wire bytes from the interfaces' counters, and the error the codecs inject into real
gradients (issue 22's "Measure"; results and commands in docs/perf/compression.txt).

    python bench/compression.py collective --link shm -n 4
    python bench/compression.py collective --link 1gbit -n 4     # 4 emulated hosts (root)
    python bench/compression.py collective --link 10gbit -n 4
    python bench/compression.py fidelity -n 4
    python bench/compression.py crossover -n 4 --sizes 16M --codecs fp32,bf16,int8,auto

*collective*: N ranks all_reduce float32 arrays of each size through each codec (None is
the engine's fp32 ring). Effective bandwidth = fp32 bytes / seconds per call (the
slowest rank's best of ``--reps`` after two warm-up calls, which are also auto's two
calibration calls). ``--link shm`` runs on this host over shared memory; ``--link RATE``
puts rank i in network namespace rrcmp<i> (made here, with a veth into a bridge in
namespace rrcmpsw, both directions shaped by ``tc tbf`` at RATE, taken down at the end),
and the wire bytes are the veth's tx_bytes counter per rank and call, headers and
retransmissions included.

*crossover*: *collective* on 4 emulated hosts at each of ``--rates``, each codec's
measured speedup over the fp32 ring set beside the one auto's cost model predicts from
what it measured on that link (calibrated on the first size of at least 256 KiB, then
asked for every size: the policy object, the one place this bench goes past the public
API), and where compression starts to pay by each: the size at each rate (the model's
``crossover_bytes``), and the rate at each size.

*fidelity*: the ranks train a small numpy MLP with exact all-reduces and keep every
step's float32 gradients (a real run's snapshots); each codec then reduces that sequence,
with and without error feedback, against the float64 sum of the same inputs: per call
the relative L2 error and the bias (mean signed error / RMS of the exact sum), over the
run the relative error of the summed results (what SGD integrates, where error feedback
pays), and whether every rank got the same bits.

Only the public API is used (``comm.all_reduce(x, compression=..., error_feedback=...)``),
so faster codec kernels are picked up by re-running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CODECS = ["fp32", "bf16", "fp16", "int8", "int4", "auto"]
NS, SWITCH, SUBNET = "rrcmp", "rrcmpsw", "10.232.0"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n:g} B"


# ---- emulated hosts ----------------------------------------------------------------


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=60)


def hosts_up(
    n: int,
    rate: str,
    ns: str = NS,
    switch: str = SWITCH,
    subnet: str = SUBNET,
    dev: str = "c",
    burst: int = 256 * 1024,
) -> None:
    """n namespaces ``ns0..`` (addresses subnet.1..) on a bridge in ``switch``, each veth
    shaped to ``rate`` both ways; ``dev`` prefixes the veths' names (bench/compression_e2e.py
    makes its own hosts with other names). tbf lets ``burst`` bytes through at the veth's
    own speed before the rate holds; 64 KiB no longer held 1 or 10 Gbit/s on the 2-core
    machine (docs/perf/compression_crossover_fine.txt)."""
    sh("ip", "netns", "add", switch)
    sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", switch, "link", "set", "br0", "up")
    for i in range(n):
        host, veth, port = f"{ns}{i}", f"{dev}veth{i}", f"{dev}port{i}"
        sh("ip", "netns", "add", host)
        sh(
            "ip",
            "link",
            "add",
            veth,
            "netns",
            host,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            switch,
        )
        sh("ip", "-n", host, "addr", "add", f"{subnet}.{i + 1}/24", "dev", veth)
        for link in (veth, "lo"):
            sh("ip", "-n", host, "link", "set", link, "up")
        sh("ip", "-n", switch, "link", "set", port, "master", "br0")
        sh("ip", "-n", switch, "link", "set", port, "up")
        for where, link in ((host, veth), (switch, port)):
            sh(
                "ip",
                "netns",
                "exec",
                where,
                "tc",
                "qdisc",
                "add",
                "dev",
                link,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                str(burst),
                "latency",
                "50ms",
            )


def hosts_down(n: int, ns: str = NS, switch: str = SWITCH) -> None:
    for name in [f"{ns}{i}" for i in range(n)] + [switch]:
        subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL, check=False)


def launch(args: argparse.Namespace, mode: str) -> dict:
    """Runs the N ranks of ``mode`` and returns rank 0's JSON report."""
    return run_ranks(args, [os.path.abspath(__file__), "--rank-main", mode, json.dumps(vars(args))])


def run_ranks(
    args: argparse.Namespace,
    argv: list,
    ns: str = NS,
    switch: str = SWITCH,
    subnet: str = SUBNET,
    dev: str = "c",
    env: Optional[dict] = None,
) -> Any:
    """Runs ``python argv`` as each of ``args.n`` ranks, on this host over shared memory
    (``args.link`` "shm") or on emulated hosts at ``args.link`` (made with `hosts_up`
    and taken down at the end), and returns the JSON on rank 0's last line of output."""
    n, shaped = args.n, args.link != "shm"
    port = str(20000 + int.from_bytes(os.urandom(2), "little") % 20000)
    if shaped:
        hosts_down(n, ns, switch)
        hosts_up(n, args.link, ns, switch, subnet, dev, burst=parse_size(args.burst))
    procs = []
    try:
        for r in range(n):
            rank_env = {
                **os.environ,
                **(env or {}),
                "RANK": str(r),
                "WORLD_SIZE": str(n),
                "MASTER_PORT": port,
                "MASTER_ADDR": f"{subnet}.1" if shaped else "127.0.0.1",
            }
            cmd = [sys.executable, *argv]
            if shaped:
                cmd = ["ip", "netns", "exec", f"{ns}{r}", *cmd]
                rank_env["RINGREDUCE_HOST_ID"] = f"emulated-{r}"
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
        return json.loads(outs[0].strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if shaped:
            hosts_down(n, ns, switch)


# ---- rank side -----------------------------------------------------------------------


def tx_bytes() -> int:
    """This rank's bytes sent on its emulated host's link (0 without one)."""
    names = [d for d in os.listdir("/sys/class/net") if d.startswith("cveth")]
    if not names:
        return 0
    with open(f"/sys/class/net/{names[0]}/statistics/tx_bytes") as f:
        return int(f.read())


def rank_collective(comm: Any, opts: dict) -> dict:
    from ringreduce.compression import configure, settings

    rows = []
    for size in [parse_size(s) for s in opts["sizes"].split(",")]:
        x = np.random.default_rng(comm.rank).standard_normal(size // 4, dtype=np.float32)
        for codec in opts["codecs"].split(","):
            # "int8/never": int8 with calls run whole (the pieces setting after "/");
            # "int8/131072": in pieces of that many values per chunk.
            name, _, how = codec.partition("/")
            compression = None if name == "fp32" else name
            default, default_values = settings().pieces, settings().piece_values
            if how.isdigit():
                configure(pieces="always", piece_values=int(how))
            else:
                configure(pieces=how or default)
            try:
                for _ in range(2):  # warm-up; auto's calibration
                    comm.all_reduce(x, compression=compression)
                times, wire = [], 0
                for _ in range(opts["reps"]):
                    comm.barrier()
                    before = tx_bytes()
                    t0 = time.perf_counter()
                    comm.all_reduce(x, compression=compression)
                    times.append(time.perf_counter() - t0)
                    wire += tx_bytes() - before
            finally:
                configure(pieces=default, piece_values=default_values)
            worst = comm.all_reduce(np.array([min(times), wire / opts["reps"]]), "max")
            rows.append(
                {"size": size, "codec": codec, "seconds": float(worst[0]), "wire": float(worst[1])}
            )
    if opts.get("predict"):  # the model's prediction at every size (the same on every rank)
        from ringreduce._comm.compressed.route import _state

        policy = _state(comm).auto
        for row in rows:
            if row["codec"] == "auto" and policy.calibrated:
                row["predicted"] = policy.predict(row["size"] // 4, 4, False)[0]
                row["crossover_bytes"] = policy.crossover_bytes()
    return {"rows": rows, "transport": comm.transport, "n": comm.world_size}


def mlp_gradients(comm: Any, steps: int) -> list:
    """Every step's float32 gradients (flattened) of a 2-layer tanh MLP trained with
    exact all-reduces on this rank's share of a synthetic regression task."""
    rng = np.random.default_rng(1234)  # the same model and teacher on every rank
    d, h, o = 128, 512, 16
    teacher = rng.standard_normal((d, o)) / np.sqrt(d)
    w1, b1 = rng.standard_normal((d, h)) / np.sqrt(d), np.zeros(h)
    w2, b2 = rng.standard_normal((h, o)) / np.sqrt(h), np.zeros(o)
    data = np.random.default_rng(comm.rank)
    snaps = []
    for _ in range(steps):
        x = data.standard_normal((64, d))
        y = np.sin(x @ teacher)
        a = np.tanh(x @ w1 + b1)
        delta = (a @ w2 + b2 - y) / len(x)
        gw2, gb2 = a.T @ delta, delta.sum(0)
        da = (delta @ w2.T) * (1 - a**2)
        gw1, gb1 = x.T @ da, da.sum(0)
        g = np.concatenate([p.ravel() for p in (gw1, gb1, gw2, gb2)]).astype(np.float32)
        snaps.append(g.copy())
        avg = comm.all_reduce(g, "avg").astype(np.float64)
        at = 0
        for p in (w1, b1, w2, b2):
            p -= 0.5 * avg[at : at + p.size].reshape(p.shape)
            at += p.size
    return snaps


def rank_fidelity(comm: Any, opts: dict) -> dict:
    snaps = mlp_gradients(comm, opts["steps"])
    exact = [np.asarray(comm.all_gather(g), np.float64).sum(0) for g in snaps]
    rows = []
    for codec in [c for c in opts["codecs"].split(",") if c not in ("fp32", "auto")]:
        for ef in (False, True):
            residual = np.zeros(snaps[0].size, np.float32) if ef else None
            errs, biases, same = [], [], True
            total = np.zeros(snaps[0].size)
            for g, ref in zip(snaps, exact):
                y = comm.all_reduce(g, compression=codec, error_feedback=residual)
                errs.append(np.linalg.norm(y - ref) / np.linalg.norm(ref))
                biases.append(np.mean(y - ref) / np.sqrt(np.mean(ref**2)))
                total += y
                rows_all = np.asarray(comm.all_gather(y))
                same &= bool((rows_all.view(np.uint32) == y.view(np.uint32)).all())
            ref_total = np.sum(exact, axis=0)
            rows.append(
                {
                    "codec": codec,
                    "ef": ef,
                    "err": float(np.mean(errs)),
                    "worst": float(np.max(errs)),
                    "bias": float(np.mean(biases)),
                    "summed": float(np.linalg.norm(total - ref_total) / np.linalg.norm(ref_total)),
                    "same": bool(comm.all_reduce(np.array([0 if same else 1]), "max")[0] == 0),
                }
            )
    return {"rows": rows, "values": int(snaps[0].size), "steps": len(snaps), "n": comm.world_size}


def rank_main(mode: str, opts: dict) -> None:
    import ringreduce as rr

    comm = rr.init("shm" if opts["link"] == "shm" else "tcp", timeout=600)
    report = (rank_collective if mode == "collective" else rank_fidelity)(comm, opts)
    if comm.rank == 0:
        print(json.dumps(report), flush=True)
    comm.close()


# ---- tables ----------------------------------------------------------------------------


def collective_table(report: dict, link: str) -> str:
    rows = report["rows"]
    base = {r["size"]: r["seconds"] for r in rows if r["codec"] == "fp32"}
    out = [
        f"collective: {link}, {report['n']} ranks ({report['transport']}); effective "
        "bandwidth = fp32 bytes / s per call (GB = 1e9), x = against the fp32 ring",
        "",
        "| size | codec | ms | eff. GB/s | x fp32 | wire bytes/rank | wire/fp32 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    wire0 = {r["size"]: r["wire"] for r in rows if r["codec"] == "fp32"}
    for r in rows:
        s, t = r["size"], r["seconds"]
        wire = f"{r['wire']:.3g}" if r["wire"] else "-"
        ratio = f"{r['wire'] / wire0[s]:.3f}" if r["wire"] and wire0.get(s) else "-"
        out.append(
            f"| {human(s)} | {r['codec']} | {t * 1e3:.2f} | {s / t / 1e9:.3f} | "
            f"{base[s] / t:.2f} | {wire} | {ratio} |"
        )
    return "\n".join(out)


def fidelity_table(report: dict) -> str:
    out = [
        f"fidelity: {report['n']} ranks, {report['steps']} gradient snapshots of "
        f"{report['values']} float32 values (MLP 128-512-16), against the float64 sum",
        "",
        "| codec | error feedback | rel. error/call (mean) | worst | bias | "
        "rel. error of the summed results | ranks bitwise identical |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        out.append(
            f"| {r['codec']} | {'yes' if r['ef'] else 'no'} | {r['err']:.2e} | "
            f"{r['worst']:.2e} | {r['bias']:+.1e} | {r['summed']:.2e} | "
            f"{'yes' if r['same'] else 'NO'} |"
        )
    return "\n".join(out)


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, mult in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * mult
    raise SystemExit(f"--rates: {rate!r} is not a tc rate such as 500mbit or 2gbit")


def crossing(points: list) -> Optional[float]:
    """Where a speedup rises through 1 along x (a size, or a link's seconds per byte),
    from (x, speedup) pairs: interpolated linearly in log(x) and log(speedup) between
    the two points around it; 0 when it is above 1 everywhere, inf when nowhere."""
    points = sorted(points)
    for (x0, s0), (x1, s1) in zip(points, points[1:]):
        if s0 < 1 <= s1:
            f = np.log(s0) / (np.log(s0) - np.log(s1))
            return float(np.exp(np.log(x0) + f * (np.log(x1) - np.log(x0))))
    if all(s >= 1 for _, s in points):
        return 0.0
    return float("inf") if all(s < 1 for _, s in points) else None


def crossover_table(reports: dict) -> str:
    """Measured against predicted, per rate, size and codec; then where each codec starts
    to pay, along the sizes at each rate (measured; the model's crossover_bytes) and
    along the link rates at each size."""
    out = [
        "crossover: measured x fp32 (the fp32 ring's time / the codec's) against auto's "
        "model (its predicted exact time / its predicted codec time), the model "
        "calibrated on the first size of at least 256 KiB",
        "",
        "| rate | size | codec | ms | x fp32 | predicted ms | predicted x fp32 | "
        "predicted / measured ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    by_size: dict = {}  # (rate, codec) -> measured [(size, x)], model's crossover bytes
    by_rate: dict = {}  # (size, codec) -> measured and predicted [(s per bit, x)]
    for rate, report in sorted(reports.items(), key=lambda kv: rate_bits(kv[0])):
        rows = report["rows"]
        for size in sorted({r["size"] for r in rows}):
            at = {r["codec"]: r for r in rows if r["size"] == size}
            auto = at.get("auto") or {}
            pred = auto.get("predicted") or {}
            for codec, r in at.items():
                if codec in ("fp32", "auto"):
                    continue
                x = at["fp32"]["seconds"] / r["seconds"]
                p_ms = pred.get(codec)
                px = pred["exact"] / p_ms if p_ms else float("nan")
                entry = by_size.setdefault((rate, codec), {"measured": [], "model": None})
                entry["measured"].append((size, x))
                if auto.get("crossover_bytes"):
                    entry["model"] = auto["crossover_bytes"].get(codec)
                curve = by_rate.setdefault((size, codec), {"measured": [], "predicted": []})
                curve["measured"].append((1 / rate_bits(rate), x))
                if p_ms:
                    curve["predicted"].append((1 / rate_bits(rate), px))
                out.append(
                    f"| {rate} | {human(size)} | {codec} | {r['seconds'] * 1e3:.1f} | "
                    f"{x:.2f} | {p_ms * 1e3 if p_ms else float('nan'):.1f} | {px:.2f} | "
                    f"{p_ms / r['seconds'] if p_ms else float('nan'):.2f} |"
                )

    def size_text(v: Optional[float]) -> str:
        if v is None:
            return "- (crosses more than once)"
        return {0.0: "every size", float("inf"): "no size"}.get(v) or human(v)

    def rate_text(v: Optional[float]) -> str:
        if v is None:
            return "- (crosses more than once)"
        return {0.0: "every rate", float("inf"): "no rate"}.get(v) or f"{1 / v / 1e9:.2f} Gbit/s"

    out += [
        "",
        "Where each codec starts to pay, along the sizes (measured: interpolated "
        "between the sizes around it; model: its crossover_bytes):",
        "",
        "| rate | codec | from, measured | from, model | model / measured |",
        "|---|---|---|---|---:|",
    ]
    for (rate, codec), e in by_size.items():
        m, p = crossing(e["measured"]), e["model"]
        ratio = f"{p / m:.2f}" if m and p and np.isfinite(m) and np.isfinite(p) else "-"
        out.append(f"| {rate} | {codec} | {size_text(m)} | {size_text(p)} | {ratio} |")
    out += [
        "",
        "Along the link rates (slower than this, the codec pays):",
        "",
        "| size | codec | measured | model |",
        "|---:|---|---|---|",
    ]
    for (size, codec), c in sorted(by_rate.items()):
        model = rate_text(crossing(c["predicted"])) if c["predicted"] else "-"
        out.append(f"| {human(size)} | {codec} | {rate_text(crossing(c['measured']))} | {model} |")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], json.loads(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["collective", "fidelity", "crossover"])
    p.add_argument("-n", type=int, default=4, help="ranks (one per emulated host)")
    p.add_argument("--link", default="shm", help="shm, or a tc rate: 1gbit, 10gbit")
    p.add_argument("--sizes", default="64K,1M,16M,64M,256M")
    p.add_argument(
        "--codecs",
        default=",".join(CODECS),
        help="codecs, fp32 and auto; NAME/always and NAME/never run NAME's large calls in "
        "pieces or whole (the pieces setting; NAME alone: its default, auto); NAME/K in "
        "pieces of K values per chunk",
    )
    p.add_argument(
        "--rates",
        default="250mbit,500mbit,1gbit,2gbit,4gbit,8gbit",
        help="crossover: the link rates to measure at (4 emulated hosts)",
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--burst", default="256K", help="tc tbf's burst on every shaped link")
    p.add_argument("--steps", type=int, default=30, help="fidelity: training steps")
    p.add_argument("--timeout", type=float, default=3000)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--render", help="print the tables of a --json report instead of running")
    args = p.parse_args()
    if args.mode == "fidelity":
        args.link = "shm"
    if args.render:
        with open(args.render) as f:
            report = json.load(f)
        args.json = None
    elif args.mode == "crossover":
        codecs = args.codecs.split(",")
        args.codecs = ",".join(
            ["fp32"] + [c for c in codecs if c not in ("fp32", "auto")] + ["auto"]
        )
        report = {}
        args.predict = True
        for rate in args.rates.split(","):
            args.link = rate
            report[rate] = launch(argparse.Namespace(**vars(args)), "collective")
    else:
        report = launch(args, args.mode)
    if args.mode == "crossover":
        print(crossover_table(report))
    else:
        print(
            collective_table(report, args.link)
            if args.mode == "collective"
            else fidelity_table(report)
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
