"""Compression end to end: time to a fixed target loss on 4 emulated hosts at 1 Gbit/s,
ringreduce's GradSync (fp32, bf16, int8 + error feedback, PowerSGD, auto) against torch
DDP on Gloo (no hook, fp16_compress_hook, PowerSGD hook). Issue 22, "Measure", End to end;
results and the command in docs/perf/compression_e2e.txt.

    python bench/compression_e2e.py --link 1gbit -n 4                 # root: namespaces
    python bench/compression_e2e.py --link 1gbit --configs probe      # compute vs comm
    python bench/compression_e2e.py --link loopback --configs ours-fp32   # no root

The task: a float32 tanh MLP (``--dim``-``--hidden`` x ``--layers``-16, a few million
parameters) fits a fixed synthetic teacher (a random tanh network) by full-batch SGD with
momentum. Every rank holds its own fixed batch of ``--batch`` samples (seeded by its
rank), so the loss averaged over ranks is the exact training objective and falls
smoothly: steps to target are not blurred by minibatch noise. Model, teacher and data
seeds are the same in every configuration.

Each step: forward, then one tiny all-reduce of (loss, over-time flag) that every rank
uses to decide together whether to stop (the loss at or below ``--target``, or past
``--cap`` seconds); then backward, the gradient sync and ``optimizer.step()``. "steps"
is the number of updates applied before the loss first reached the target; "time" runs
from a barrier before step 0 to that decision, everything included (auto's two
calibration calls, DDP's first-step bucket rebuild, codec warm-up).

Each configuration runs in fresh processes, one rank per network namespace rre2e<i>
(made here: a veth into a bridge in namespace rre2esw, both directions shaped by
``tc tbf`` at ``--link``, the same setup as bench/compression.py, with names of its own
so the two can run side by side; all removed at the end, also on error or a signal).
``--link loopback`` runs the ranks on this host over loopback TCP without namespaces.
The ringreduce ranks use ``rr.init("tcp")`` with a distinct RINGREDUCE_HOST_ID per rank
(so "auto" sees separate hosts); Gloo is pinned to the namespace's interface.

``probe`` (first unless --configs says otherwise) times, with all ranks running at once
as in training, one forward+backward of the model and one fp32 all_reduce of its
gradient size through ringreduce: the ratio says whether the model is in the regime the
issue asks for (fp32 communication about 2x compute).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compression as compression_bench  # noqa: E402  (bench/compression.py)

NS, SWITCH, SUBNET = "rre2e", "rre2esw", "10.233.0"

# name -> (system, options)
CONFIGS: dict[str, tuple[str, dict]] = {
    "ours-fp32": ("ours", {}),
    "ours-bf16": ("ours", {"compression": "bf16"}),
    "ours-int8+EF": ("ours", {"compression": "int8", "error_feedback": True}),
    "ours-int4+EF": ("ours", {"compression": "int4", "error_feedback": True}),
    "ours-powersgd-r4": ("ours", {"powersgd_rank": 4}),
    "ours-auto": ("ours", {"compression": "auto"}),
    # Two blocking auto all_reduces of the gradient's size first (inside the timed
    # region), so that auto is calibrated before the first step. (It once timed
    # GradSync's async calls to their return and chose exact; async calls now run on
    # the lane and are timed to completion: plain ours-auto chose int8 on 1 Gbit/s,
    # link measured at 0.081 GB/s of input.)
    "ours-auto-precal": ("ours", {"compression": "auto", "precal": True}),
    # Gradients as views of their bucket (no copy in, none back), on both sides.
    "ours-int4+EF-views": (
        "ours",
        {"compression": "int4", "error_feedback": True, "gradient_as_bucket_view": True},
    ),
    # The same with the codec kernels' AVX2 build where the machine runs AVX-512 (the
    # kernels' speed end to end, in one interleaved run; not in the default set).
    "ours-int4+EF-avx2": ("ours", {"compression": "int4", "error_feedback": True, "isa": "avx2"}),
    "ddp-gloo-fp32": ("ddp", {}),
    "ddp-gloo-fp16hook": ("ddp", {"hook": "fp16"}),
    "ddp-gloo-fp16hook-views": ("ddp", {"hook": "fp16", "gradient_as_bucket_view": True}),
    "ddp-gloo-powersgd-r4": ("ddp", {"hook": "powersgd", "rank": 4}),
    # torch's powerSGD_hook issues its Q all-reduce from a callback thread; with several
    # buckets Gloo can pair one rank's Q with another's P. One bucket avoids that.
    "ddp-gloo-powersgd-r4-1bucket": ("ddp", {"hook": "powersgd", "rank": 4, "bucket_cap_mb": 1000}),
}
DEFAULT = ["probe", *(c for c in CONFIGS if "isa" not in CONFIGS[c][1])]
KNOWN = ["probe", *CONFIGS]
# PowerSGD at any rank: ours-powersgd-rK, ddp-gloo-powersgd-rK and ddp-gloo-powersgd-rK-1bucket.
_PSGD = re.compile(r"(ours|ddp-gloo)-powersgd-r([1-9][0-9]*)(-1bucket)?$")


def config(name: str) -> tuple[str, dict] | None:
    """The (system, options) of a configuration name, or None for an unknown one."""
    if name in CONFIGS:
        return CONFIGS[name]
    m = _PSGD.match(name)
    if m is None or (m[1] == "ours" and m[3]):
        return None
    if m[1] == "ours":
        return "ours", {"powersgd_rank": int(m[2])}
    one_bucket = {"bucket_cap_mb": 1000} if m[3] else {}
    return "ddp", {"hook": "powersgd", "rank": int(m[2]), **one_bucket}


# ---- emulated hosts: bench/compression.py's, under names of our own ---------------------


def hosts_up(n: int, rate: str) -> None:
    compression_bench.hosts_up(n, rate, NS, SWITCH, SUBNET, dev="e2e")


def hosts_down(n: int) -> None:
    compression_bench.hosts_down(n, NS, SWITCH)


def _raise_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(f"signal {signum}")


# ---- parent: one configuration ----------------------------------------------------------


def run_config(args: argparse.Namespace, name: str) -> dict:
    """Runs ``name`` on N fresh ranks; returns rank 0's report, or {"error": why}."""
    n, shaped = args.n, args.link != "loopback"
    port = str(20000 + int.from_bytes(os.urandom(2), "little") % 20000)
    procs, logs = [], []
    opts = dict(vars(args), config=name)
    try:
        for r in range(n):
            env = dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE=str(n),
                MASTER_PORT=port,
                MASTER_ADDR=f"{SUBNET}.1" if shaped else "127.0.0.1",
                RINGREDUCE_HOST_ID=f"emulated-{r}",
                OMP_NUM_THREADS="1",
            )
            if shaped:
                env["GLOO_SOCKET_IFNAME"] = f"e2eveth{r}"
            else:
                env["GLOO_SOCKET_IFNAME"] = "lo"
            cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", json.dumps(opts)]
            if shaped:
                cmd = ["ip", "netns", "exec", f"{NS}{r}", *cmd]
            log = open(f"/tmp/rre2e_{name}.rank{r}.log", "w+")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        deadline = time.monotonic() + args.cap + 120
        late = False
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                late = True
                break
            time.sleep(0.2)
        time.sleep(1.0)  # let the others fail with their own message
        out = []
        for log in logs:
            log.seek(0)
            out.append(log.read())
        codes = [p.poll() for p in procs]
        if late:
            why = f"timed out after {args.cap + 120:.0f} s"
        elif any(codes):
            why = f"rank exit codes {codes}"
        else:
            lines = [ln for ln in out[0].splitlines() if ln.startswith("{")]
            return json.loads(lines[-1])
        err = next((o for o, c in zip(out, codes) if c not in (None, 0)), out[0])
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-3:]
        return {"error": f"{why}: " + " | ".join(tail)[-400:]}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()


# ---- rank side --------------------------------------------------------------------------


def build(opts: dict) -> tuple[Any, Any, Any]:
    """The model (the same initial weights everywhere), this rank's fixed batch and its
    targets (the teacher's output, unit variance over the whole task)."""
    import torch

    d, h, o = opts["dim"], opts["hidden"], 16
    g = torch.Generator().manual_seed(7)  # the teacher: the same in every run
    t1 = torch.randn(d, 64, generator=g) / d**0.5
    t2 = torch.randn(64, o, generator=g) / 8
    rank = int(os.environ["RANK"])
    x = torch.randn(opts["batch"], d, generator=torch.Generator().manual_seed(1000 + rank))
    y = torch.tanh(x @ t1) @ t2
    # Normalise by the std of the teacher over a large reference sample, so the initial
    # loss is about 1 whatever the batch.
    ref = torch.randn(4096, d, generator=torch.Generator().manual_seed(99))
    y = y / (torch.tanh(ref @ t1) @ t2).std()
    torch.manual_seed(0)
    layers: list = [torch.nn.Linear(d, h), torch.nn.Tanh()]
    for _ in range(opts["layers"] - 1):
        layers += [torch.nn.Linear(h, h), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(h, o))
    return model, x, y


def tx_bytes() -> int:
    names = [d for d in os.listdir("/sys/class/net") if d.startswith("e2eveth")]
    if not names:
        return 0
    with open(f"/sys/class/net/{names[0]}/statistics/tx_bytes") as f:
        return int(f.read())


def rank_probe(opts: dict) -> dict:
    """Forward+backward time and one fp32 all_reduce of the gradient's size, all ranks
    at once (medians of 5 after 2 warm-up)."""
    import numpy as np
    import torch

    import ringreduce as rr

    comm = rr.init("tcp", timeout=600)
    model, x, y = build(opts)
    params = sum(p.numel() for p in model.parameters())
    buf = np.random.default_rng(comm.rank).standard_normal(params).astype(np.float32)
    fb, ar = [], []
    for i in range(7):
        comm.barrier()
        t0 = time.perf_counter()
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        t1 = time.perf_counter()
        comm.barrier()
        t2 = time.perf_counter()
        comm.all_reduce(buf, "avg")
        t3 = time.perf_counter()
        if i >= 2:
            fb.append(t1 - t0)
            ar.append(t3 - t2)
    worst = comm.all_reduce(np.array([np.median(fb), np.median(ar)]), "max")
    comm.close()
    return {"params": params, "compute_s": float(worst[0]), "allreduce_s": float(worst[1])}


def rank_train(opts: dict) -> dict:
    import numpy as np
    import torch

    system, cfg = config(opts["config"])
    model, x, y = build(opts)
    params = sum(p.numel() for p in model.parameters())
    if system == "ours":
        import ringreduce as rr
        import ringreduce.torch  # noqa: F401

        comm = rr.init("tcp", timeout=600)
        rr.torch.broadcast_parameters(model, comm)
        precal = cfg.get("precal", False)
        if "isa" in cfg:
            rr._core.use_codec_kernel_isa(cfg["isa"])
        kwargs = {k: v for k, v in cfg.items() if k not in ("precal", "isa")}
        sync = rr.torch.GradSync(model, comm, bucket_mb=opts["bucket_mb"], **kwargs)
        net = model

        def agree(v: list) -> list:
            return list(comm.all_reduce(np.array(v, np.float64), "sum"))

        barrier, finish = comm.barrier, comm.close
    else:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        dist.init_process_group("gloo")
        net = torch.nn.parallel.DistributedDataParallel(
            model,
            bucket_cap_mb=cfg.get("bucket_cap_mb", opts["bucket_mb"]),
            gradient_as_bucket_view=cfg.get("gradient_as_bucket_view", False),
        )
        if cfg.get("hook") == "fp16":
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif cfg.get("hook") == "powersgd":
            state = psgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg["rank"], start_powerSGD_iter=2
            )
            net.register_comm_hook(state, psgd.powerSGD_hook)
        sync = None

        def agree(v: list) -> list:
            t = torch.tensor(v, dtype=torch.float64)
            dist.all_reduce(t)
            return t.tolist()

        barrier, finish = dist.barrier, dist.destroy_process_group
    world = int(os.environ["WORLD_SIZE"])
    opt = torch.optim.SGD(model.parameters(), lr=opts["lr"], momentum=0.9)
    losses, step_times, bwd_times = [], [], []
    barrier()
    wire0 = tx_bytes()
    start = time.perf_counter()
    if system == "ours" and precal:
        for _ in range(2):
            comm.all_reduce(np.zeros(params, np.float32), "avg", compression="auto")
    last = time.perf_counter()
    reached = False
    steps = 0
    for steps in range(opts["max_steps"] + 1):
        loss = torch.nn.functional.mse_loss(net(x), y)
        over = time.perf_counter() - start > opts["cap"]
        total, flags = agree([loss.item(), float(over)])
        losses.append(total / world)
        if losses[-1] <= opts["target"]:
            reached = True
            break
        if flags > 0 or steps == opts["max_steps"]:
            break
        # With bucket views, gradients are zeroed where they are (in their buckets).
        opt.zero_grad(set_to_none=not cfg.get("gradient_as_bucket_view", False))
        b0 = time.perf_counter()
        loss.backward()
        if sync is not None:
            sync.wait()
        bwd_times.append(time.perf_counter() - b0)
        opt.step()
        now = time.perf_counter()
        step_times.append(now - last)
        last = now
    elapsed = time.perf_counter() - start
    wire = tx_bytes() - wire0
    extra: dict = {}
    if system == "ours":
        st = comm.stats()
        extra["codec_s"] = float(sum(st.get("codec_seconds", {}).values()))
        extra["auto"] = st.get("compression", {}).get("auto")
    barrier()
    finish()
    return {
        "config": opts["config"],
        "params": params,
        "reached": reached,
        "steps": steps,
        "seconds": elapsed,
        "losses": losses,
        "step_s": float(np.median(step_times)),
        "step_times": [round(t, 5) for t in step_times],
        "bwd_s": float(np.median(bwd_times)),
        "wire_per_step": wire / max(steps, 1),
        **extra,
    }


def rank_main(opts: dict) -> None:
    import torch

    torch.set_num_threads(1)
    report = rank_probe(opts) if opts["config"] == "probe" else rank_train(opts)
    if os.environ["RANK"] == "0":
        print(json.dumps(report), flush=True)


# ---- tables -------------------------------------------------------------------------------


def summarize(got: list) -> dict:
    """One configuration's runs: the run of median time (the probe: median numbers),
    with every run's time in "all_seconds"; an error if any run failed."""
    bad = [r for r in got if "error" in r]
    if bad:
        return {"error": f"{len(bad)} of {len(got)} runs failed; first: {bad[0]['error']}"}
    if "compute_s" in got[0]:
        mid = sorted(got, key=lambda r: r["compute_s"])[len(got) // 2]
        return dict(mid, allreduce_s=sorted(r["allreduce_s"] for r in got)[len(got) // 2])
    mid = sorted(got, key=lambda r: r["seconds"])[len(got) // 2]
    return dict(mid, all_seconds=[r["seconds"] for r in got], all_steps=[r["steps"] for r in got])


def table(reports: dict, args: argparse.Namespace) -> str:
    out = []
    probe = reports.get("probe")
    if probe and "error" not in probe:
        out.append(
            f"probe: {probe['params']:,} float32 parameters; forward+backward "
            f"{probe['compute_s'] * 1e3:.0f} ms, one fp32 all_reduce of the gradient "
            f"{probe['allreduce_s'] * 1e3:.0f} ms (slowest rank's median, all ranks at "
            f"once): communication = {probe['allreduce_s'] / probe['compute_s']:.1f}x "
            "compute"
        )
        out.append("")
    out += [
        f"end to end: {args.n} ranks, link {args.link}; target loss {args.target} "
        f"(initial about 1), lr {args.lr}, momentum 0.9, cap {args.cap:.0f} s / "
        f"{args.max_steps} steps; buckets of {args.bucket_mb:g} MB; {args.repeat} run(s) "
        "of each, rounds interleaved",
        "",
        "| configuration | steps to target | time to target (s): median (min-max) | "
        "median step (ms) | backward+sync (ms) | wire MB/step/rank | codec ms/step (rank 0) | "
        "final loss | x steps vs ours-fp32 | x faster than ddp-fp16hook |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = reports.get("ours-fp32", {})
    hook = reports.get("ddp-gloo-fp16hook", {})
    notes = []
    for name, r in reports.items():
        if name == "probe":
            continue
        if "error" in r:
            out.append(f"| {name} | - | - | - | - | - | - | - | - | - |")
            notes.append(f"- {name} did not run: {r['error']}")
            continue
        steps = str(r["steps"]) if r["reached"] else f">{r['steps']} (not reached)"
        ratio_s = (
            f"{r['steps'] / base['steps']:.2f}" if r["reached"] and base.get("reached") else "-"
        )
        speed = (
            f"{hook['seconds'] / r['seconds']:.2f}" if r["reached"] and hook.get("reached") else "-"
        )
        codec = f"{r['codec_s'] / max(r['steps'], 1) * 1e3:.0f}" if "codec_s" in r else "-"
        times = f"{r['seconds']:.1f}"
        if len(r["all_seconds"]) > 1:
            times += f" ({min(r['all_seconds']):.1f}-{max(r['all_seconds']):.1f})"
        if len(set(r["all_steps"])) > 1:
            steps += f" (runs: {r['all_steps']})"
        out.append(
            f"| {name} | {steps} | {times} | {r['step_s'] * 1e3:.0f} | "
            f"{r['bwd_s'] * 1e3:.0f} | {r['wire_per_step'] / 1e6:.2f} | {codec} | "
            f"{r['losses'][-1]:.4f} | {ratio_s} | {speed} |"
        )
        if r.get("auto"):
            notes.append(
                f"- {name}: auto chose {r['auto']['chosen']} (calls), link measured "
                f"at {r['auto']['link_gbs'] or 0:.3g} GB/s of input"
            )
    return "\n".join(out + ([""] + notes if notes else []))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(json.loads(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=4, help="ranks (one per emulated host)")
    p.add_argument("--link", default="1gbit", help="a tc rate (1gbit), or loopback")
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT),
        help="comma-separated (default: all but -avx2), from: " + ", ".join(KNOWN),
    )
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--batch", type=int, default=128, help="samples per rank (fixed)")
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=25.0,
        help="GradSync's bucket_mb and DDP's bucket_cap_mb (25: both defaults); "
        "smaller buckets give the lane something to overlap",
    )
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target", type=float, default=0.06)
    p.add_argument("--max-steps", type=int, default=90)
    p.add_argument("--cap", type=float, default=120.0, help="wall seconds per run")
    p.add_argument("--repeat", type=int, default=1, help="rounds over all configurations")
    p.add_argument("--json", help="also write every run's report here")
    p.add_argument("--out", help="also write the table, the command and the machine here")
    args = p.parse_args()
    names = args.configs.split(",")
    unknown = [c for c in names if c != "probe" and config(c) is None]
    if unknown:
        p.error(
            f"unknown configs {unknown}; known: {KNOWN}, and ours-powersgd-rK, "
            "ddp-gloo-powersgd-rK[-1bucket] for any rank K"
        )
    shaped = args.link != "loopback"
    old = signal.signal(signal.SIGTERM, _raise_on_signal)
    load0 = os.getloadavg()
    runs: dict[str, list] = {}
    try:
        if shaped:
            hosts_down(args.n)
            hosts_up(args.n, args.link)
        for rnd in range(args.repeat):
            for name in names:  # rounds interleave the configurations: load drift hits all
                print(f"# round {rnd + 1}/{args.repeat}: {name} ...", file=sys.stderr, flush=True)
                runs.setdefault(name, []).append(run_config(args, name))
                print(f"#   {json.dumps(runs[name][-1])[:300]}", file=sys.stderr, flush=True)
    finally:
        if shaped:
            hosts_down(args.n)
        signal.signal(signal.SIGTERM, old)
    reports = {name: summarize(got) for name, got in runs.items()}
    text = table(reports, args)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f)
    if args.out:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        head = [
            "Compression end to end, measured with bench/compression_e2e.py (issue 22, "
            '"Measure", End to end).',
            "",
            f"Command (root; {time.strftime('%Y-%m-%d %H:%M')}, main at {commit}):",
            "",
            "  "
            + (f"nice -n {os.nice(0)} " if os.nice(0) > 0 else "")
            + "python "
            + " ".join(["bench/compression_e2e.py", *sys.argv[1:]]),
            "",
            f"Machine: {platform.node()}, {os.cpu_count()} cores shared with other work; "
            f"load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after. "
            + (
                f"{args.n} ranks (1 per network namespace) share these cores, so every "
                "rank's compute and codec work is slowed by the others'."
                if args.n > (os.cpu_count() or 1)
                else f"{args.n} ranks (1 per network namespace), a core each."
            ),
            "",
        ]
        with open(args.out, "w") as f:
            f.write("\n".join(head) + "\n" + text + "\n")


if __name__ == "__main__":
    main()
