"""Kill -9 trials: is the rank that died named by every survivor, promptly, every time?

    python bench/kill_trials.py -n 4 --trials 100
    python bench/kill_trials.py -n 4 --trials 20 --transport shm --seed 7

Each trial starts N local ranks (environment rendezvous on a free loopback port) that run
a loop of mixed collectives (all_reduce of small and large arrays, async all_reduce,
broadcast, all_gather, reduce_scatter, reduce, barrier), waits until every rank is in
the loop, then after a random delay kills one rank, chosen at random (rank 0, which
hosts the rendezvous store, included), with SIGKILL. Every survivor must leave its loop
with a RingReduceError whose ``peer`` is the killed rank, within 5 s of the kill (it
reports the error's class, ``peer`` and text on stdout), and exit: a survivor still
running at the trial's hard deadline counts as a hang and is killed.

The table counts survivors: named correctly, named wrong (which rank they named
instead, and their message), within 5 s, hangs, and survivors that died without
reporting; then the same by killed rank, and the detection latency.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from ringreduce.launch import free_port

PROMPT_S = 5.0  # a survivor must report within this many seconds of the kill


# ---- a rank ----------------------------------------------------------------------------


def _rank_main(transport: str, timeout: float) -> None:
    """One rank: report "ready" once in the loop, then run collectives until one fails;
    report that error as a JSON line and exit."""
    import numpy as np

    import ringreduce as rr

    comm = rr.init(transport, timeout=timeout)
    n, r = comm.world_size, comm.rank
    small = np.ones(7, dtype=np.float32)
    large = np.ones(1 << 18, dtype=np.float32)
    ints = np.arange(1000, dtype=np.int64)
    calls = [
        lambda: comm.all_reduce(small),
        lambda: comm.all_reduce(large, out=large),
        lambda: comm.all_reduce(ints, op="max", async_op=True).wait(),
        lambda: comm.broadcast(ints, root=calls_done[0] % n),
        lambda: comm.all_gather(small),
        lambda: comm.reduce_scatter(large),
        lambda: comm.reduce(ints, root=(calls_done[0] + 1) % n),
        lambda: comm.barrier(),
    ]
    calls_done = [0]
    report: Dict[str, Any] = {"rank": r}
    try:
        for i in range(20):  # warm up: every link used once before the kill
            calls[i % len(calls)]()
            calls_done[0] += 1
        print(json.dumps({"rank": r, "ready": True}), flush=True)
        while True:
            calls[calls_done[0] % len(calls)]()
            large[:] = 1
            calls_done[0] += 1
    except rr.RingReduceError as exc:
        report.update(kind=type(exc).__name__, peer=exc.peer, message=str(exc), at=time.monotonic())
    except Exception as exc:  # noqa: BLE001 (any other error is reported as such)
        report.update(kind=type(exc).__name__, peer=None, message=str(exc), at=time.monotonic())
    report["calls"] = calls_done[0]
    print(json.dumps(report), flush=True)
    os._exit(0)  # the communicator is broken: do not wait on it at exit


# ---- the trials --------------------------------------------------------------------------


def _lines(path: str) -> List[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except FileNotFoundError:
        pass
    return out


def _trial(n: int, victim: int, delay: float, args: argparse.Namespace, tmp: str) -> dict:
    port = free_port()
    procs, logs = [], []
    for rank in range(n):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RINGREDUCE_PORT=str(port),
        )
        for var in ("LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
            env.pop(var, None)
        out = os.path.join(tmp, f"rank{rank}.out")
        err = os.path.join(tmp, f"rank{rank}.err")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--rank-worker",
            "--transport",
            args.transport,
            "--timeout",
            str(args.timeout),
        ]
        with open(out, "w") as fo, open(err, "w") as fe:
            procs.append(subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env))
        logs.append((out, err))
    result: dict = {"victim": victim, "survivors": {}, "start_failed": None}
    try:
        deadline = time.monotonic() + args.start_timeout
        while time.monotonic() < deadline:
            ready = [any(x.get("ready") for x in _lines(o)) for o, _ in logs]
            if all(ready) or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        if not all(any(x.get("ready") for x in _lines(o)) for o, _ in logs):
            # Each rank: still running or its exit code, what it reported, its stderr.
            result["start_failed"] = {
                r: {
                    "exit": procs[r].poll(),
                    "reports": _lines(o)[-2:],
                    "stderr": open(e).read()[-400:],
                }
                for r, (o, e) in enumerate(logs)
            }
            return result
        time.sleep(delay)
        killed_at = time.monotonic()
        os.kill(procs[victim].pid, signal.SIGKILL)
        hard = killed_at + args.deadline
        for rank, p in enumerate(procs):
            if rank == victim:
                p.wait()
                continue
            try:
                p.wait(timeout=max(0.0, hard - time.monotonic()))
            except subprocess.TimeoutExpired:
                result["survivors"][rank] = {"outcome": "hang"}
                continue
            reports = [x for x in _lines(logs[rank][0]) if "kind" in x]
            if not reports:
                tail = open(logs[rank][1]).read()[-300:]
                result["survivors"][rank] = {"outcome": "no report", "stderr": tail}
                continue
            rep = reports[-1]
            rep["latency"] = rep["at"] - killed_at
            rep["outcome"] = "named" if rep.get("peer") == victim else "wrong"
            result["survivors"][rank] = rep
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _summary(results: List[dict], n: int) -> str:
    survivors = [(t["victim"], r, s) for t in results for r, s in t["survivors"].items()]
    started = [t for t in results if t["start_failed"] is None]
    named = [s for _, _, s in survivors if s["outcome"] == "named"]
    wrong = [(v, r, s) for v, r, s in survivors if s["outcome"] == "wrong"]
    hangs = [(v, r) for v, r, s in survivors if s["outcome"] == "hang"]
    silent = [(v, r, s) for v, r, s in survivors if s["outcome"] == "no report"]
    prompt = [s for _, _, s in survivors if "latency" in s and s["latency"] <= PROMPT_S]
    prompt_named = [s for s in named if s["latency"] <= PROMPT_S]
    perfect = sum(
        1
        for t in started
        if len(t["survivors"]) == n - 1
        and all(
            s["outcome"] == "named" and s["latency"] <= PROMPT_S for s in t["survivors"].values()
        )
    )
    lines = [
        f"trials: {len(results)} ({len(results) - len(started)} failed to start), "
        f"{n} ranks, {len(survivors)} survivors",
        f"trials with every survivor naming the killed rank within {PROMPT_S:.0f} s: "
        f"{perfect}/{len(started)}",
        f"survivors that named the killed rank:      {len(named)}/{len(survivors)}",
        f"  ... and within {PROMPT_S:.0f} s of the kill:"
        f"          {len(prompt_named)}/{len(survivors)}",
        f"survivors that named another rank:         {len(wrong)}",
        f"survivors that reported within {PROMPT_S:.0f} s:       {len(prompt)}/{len(survivors)}",
        f"hangs (no exit by the hard deadline):      {len(hangs)}",
        f"survivors that died without a report:      {len(silent)}",
    ]
    latencies = sorted(s["latency"] for _, _, s in survivors if "latency" in s)
    if latencies:
        lines.append(
            f"detection latency: median {statistics.median(latencies):.3f} s, "
            f"max {latencies[-1]:.3f} s"
        )
    lines.append("")
    lines.append("by killed rank: trials, survivors named / wrong / hangs / no report")
    for v in range(n):
        ts = [t for t in started if t["victim"] == v]
        ss = [s for t in ts for s in t["survivors"].values()]
        counts = collections.Counter(s["outcome"] for s in ss)
        lines.append(
            f"  rank {v}: {len(ts):3d} trials, {counts['named']}/{len(ss)} named, "
            f"{counts['wrong']} wrong, {counts['hang']} hangs, {counts['no report']} no report"
        )
    if wrong:
        lines.append("")
        lines.append("named wrong (killed rank -> survivor named, kind: message):")
        seen = collections.Counter(
            (v, r, s.get("peer"), s.get("kind"), s.get("message", "")[:160]) for v, r, s in wrong
        )
        for (v, r, peer, kind, msg), count in seen.most_common(12):
            lines.append(f"  x{count} killed {v}, rank {r} named {peer} ({kind}): {msg}")
    if silent:
        lines.append("")
        lines.append("died without a report (killed rank, survivor: stderr tail):")
        for v, r, s in silent[:5]:
            lines.append(f"  killed {v}, rank {r}: {s.get('stderr', '').strip()[-200:]}")
    failed = [t for t in results if t["start_failed"]]
    if failed:
        lines.append("")
        lines.append("trials that did not start (rank: exit code or None if running, report):")
        for t in failed[:3]:
            for r, f in t["start_failed"].items():
                said = f["reports"][-1] if f["reports"] else f["stderr"].strip()[-200:]
                lines.append(f"  rank {r}: exit {f['exit']}: {json.dumps(said)[:300]}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", type=int, default=4, help="ranks per trial (default 4)")
    p.add_argument("--trials", type=int, default=100, help="number of trials (default 100)")
    p.add_argument("--transport", default="tcp", choices=["tcp", "shm", "auto"])
    p.add_argument("--seed", type=int, default=0, help="victims and delays (default 0)")
    p.add_argument("--min-delay", type=float, default=0.0, help="s after ready (default 0)")
    p.add_argument("--max-delay", type=float, default=1.0, help="s after ready (default 1)")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="each rank's communicator timeout, s (default 30)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=45.0,
        help="a survivor not exited this long after the kill hangs (default 45)",
    )
    p.add_argument("--start-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help="also write every trial's outcome to this file")
    args = p.parse_args(argv)
    if args.rank_worker:
        _rank_main(args.transport, args.timeout)
        return 0
    n = args.nprocs
    if n < 2:
        p.error("-n must be at least 2")
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="rr-kill-") as tmp:
        for i in range(args.trials):
            victim = rng.randrange(n)
            delay = rng.uniform(args.min_delay, args.max_delay)
            t = _trial(n, victim, delay, args, tmp)
            t["delay"] = delay
            results.append(t)
            outcomes = collections.Counter(s["outcome"] for s in t["survivors"].values())
            print(
                f"trial {i + 1}/{args.trials}: killed rank {victim} after {delay:.2f} s: "
                + (", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "did not start"),
                flush=True,
            )
    print()
    print(
        f"# python bench/kill_trials.py -n {n} --trials {args.trials} "
        f"--transport {args.transport} --seed {args.seed}"
    )
    print(_summary(results, n))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
