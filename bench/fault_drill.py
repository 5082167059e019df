"""Fault drill: kill ranks in the middle of collectives and measure how the survivors
get back to work with ``Communicator.shrink()``.

    python bench/fault_drill.py                       # N = 2, 4, 8 on shm and tcp, each failure
    python bench/fault_drill.py --sizes 4 --transports tcp --failures kill --trials 10

For every case (transport, N, how the victim fails, where), N ranks loop a collective
on 1 MiB of float32; after a random 0.2-0.6 s the victim(s) fail:

- ``kill``: SIGKILL (no goodbye); ``exit``: ``os._exit(3)`` without closing anything;
- ``stop``: SIGSTOP (alive but silent: the survivors notice at their timeout,
  ``--timeout``, and the agreement counts it dead when it does not check in).

Each survivor reports when its call raised PeerError or TimeoutError (*detection*, from
the moment the victim failed), how long ``shrink()`` took (*shrink*), and whether an
all_reduce on the shrunk communicator matches numpy. The table gives, per case, the
worst survivor: detection, shrink, detection to a usable shrunk communicator, the
calls lost (the one in flight), wrong results and hangs (a rank that did not finish
within ``--case-timeout``). ``--json`` writes every survivor's report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.abspath(__file__)


# -- one rank ------------------------------------------------------------------------------
def rank_main(argv: List[str]) -> None:
    import numpy as np

    import ringreduce as rr

    rank, n, port, transport, victims, how, where, delay, timeout = argv
    rank, n = int(rank), int(n)
    victims = [int(v) for v in victims.split(",")]
    comm = rr.init(transport, rank=rank, world_size=n, master_addr="127.0.0.1",
                   master_port=int(port), timeout=float(timeout))  # fmt: skip
    x = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    comm.all_reduce(x, out=x)
    x[:] = 1
    print(json.dumps({"rank": rank, "ready": time.time()}), flush=True)
    start = time.monotonic()
    calls = 0
    try:
        while True:
            if rank in victims and time.monotonic() - start > float(delay):
                print(json.dumps({"rank": rank, "failed_at": time.time()}), flush=True)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif how == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                    time.sleep(3600)  # the driver kills it
                os._exit(3)
            if where == "broadcast":
                comm.broadcast(x, root=calls % n)
            else:
                comm.all_reduce(x, out=x)
                x[:] = 1
            calls += 1
    except (rr.PeerError, rr.TimeoutError) as exc:
        detected = time.time()
        kind = type(exc).__name__
    t0 = time.monotonic()
    new = comm.shrink()
    shrink_s = time.monotonic() - t0
    got = new.all_reduce(np.full(1000, new.rank + 1.0))
    ok = bool(np.all(got == new.world_size * (new.world_size + 1) / 2))
    report = {
        "rank": rank,
        "detected": detected,
        "kind": kind,
        "shrink_s": shrink_s,
        "calls": calls,
        "failed_ranks": sorted(comm.failed_ranks),
        "new_size": new.world_size,
        "ok": ok,
    }
    print(json.dumps(report), flush=True)
    new.close()
    comm.close()


# -- the driver ----------------------------------------------------------------------------
def free_port() -> int:
    from ringreduce.launch import free_port as pick

    return pick()


def run_case(
    n: int, transport: str, how: str, where: str, victims: List[int], args: argparse.Namespace
) -> Dict[str, Any]:
    port = free_port()
    delay = f"{random.uniform(0.2, 0.6):.3f}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                HERE,
                "--rank-main",
                str(r),
                str(n),
                str(port),
                transport,
                ",".join(map(str, victims)),
                how,
                where,
                delay,
                str(args.timeout),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(n)
    ]
    deadline = time.monotonic() + args.case_timeout
    reports: Dict[int, Dict[str, Any]] = {}
    failed_at: Optional[float] = None
    hung, errors = [], []
    for r, p in enumerate(procs):
        if r in victims and how == "stop":
            continue
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(r)
            continue
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                if "failed_at" in row:
                    failed_at = (
                        row["failed_at"] if failed_at is None else min(failed_at, row["failed_at"])
                    )
                elif "detected" in row:
                    reports[r] = row
        if r not in victims and r not in reports:
            errors.append(f"rank {r} (exit {p.returncode}): {err.strip()[-400:]}")
    for p in procs:
        if p.poll() is None:
            p.kill()
            out, _ = p.communicate()
            for line in out.splitlines():
                if '"failed_at"' in line:
                    at = json.loads(line)["failed_at"]
                    failed_at = at if failed_at is None else min(failed_at, at)
    survivors = [r for r in range(n) if r not in victims]
    row: Dict[str, Any] = {
        "transport": transport, "n": n, "how": how, "where": where, "victims": victims,
        "survivors": len(survivors), "reported": len(reports), "hung": hung, "errors": errors,
    }  # fmt: skip
    if failed_at is not None and reports:
        detect = [rep["detected"] - failed_at for rep in reports.values()]
        shrink = [rep["shrink_s"] for rep in reports.values()]
        usable = [rep["detected"] + rep["shrink_s"] - failed_at for rep in reports.values()]
        agreed = {tuple(rep["failed_ranks"]) for rep in reports.values()}
        row.update(
            detect_s=max(detect), shrink_s=max(shrink), shrink_median_s=statistics.median(shrink),
            usable_s=max(usable), wrong=sum(not rep["ok"] for rep in reports.values()),
            agreed=len(agreed) == 1 and agreed == {tuple(sorted(victims))},
            lost_calls=1,
        )  # fmt: skip
    row["reports"] = reports
    return row


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-main"]:
        rank_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2,4,8", help="world sizes (default 2,4,8)")
    p.add_argument("--transports", default="shm,tcp", help="default shm,tcp")
    p.add_argument("--failures", default="kill,exit,stop", help="default kill,exit,stop")
    p.add_argument("--where", default="all_reduce", help="all_reduce and/or broadcast")
    p.add_argument("--victims", type=int, default=1, help="ranks failing at once (default 1)")
    p.add_argument("--at", help="these ranks fail (default: --victims ranks at random)")
    p.add_argument("--trials", type=int, default=3, help="per case (default 3)")
    p.add_argument("--timeout", type=float, default=3.0, help="communicator timeout, s")
    p.add_argument("--case-timeout", type=float, default=60.0, help="a hang after this, s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    random.seed(args.seed)
    rows = []
    print("| transport | N | failure | where | victims | detection | shrink (worst / median) "
          "| detection to usable | agreed | wrong | hangs |")  # fmt: skip
    print("|---|---:|---|---|---|---:|---:|---:|---|---:|---:|")
    for transport in args.transports.split(","):
        for n in [int(v) for v in args.sizes.split(",")]:
            for how in args.failures.split(","):
                for where in args.where.split(","):
                    for _ in range(args.trials):
                        victims = random.sample(range(n), min(args.victims, n - 1))
                        if args.at:
                            victims = [int(v) for v in args.at.split(",")]
                        row = run_case(n, transport, how, where, sorted(victims), args)
                        rows.append(row)
                        if "detect_s" in row:
                            ms = {k: f"{row[k] * 1e3:.0f} ms" for k in row if k.endswith("_s")}
                            print(f"| {transport} | {n} | {how} | {where} | {row['victims']} "
                                  f"| {ms['detect_s']} | {ms['shrink_s']} / {ms['shrink_median_s']} "
                                  f"| {ms['usable_s']} | {row['agreed']} "
                                  f"| {row['wrong']} | {len(row['hung'])} |", flush=True)  # fmt: skip
                        else:
                            print(f"| {transport} | {n} | {how} | {where} | {row['victims']} "
                                  f"| no report | | | | | {len(row['hung'])} | {row['errors']}",
                                  flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["hung"] or r["errors"] or not r.get("agreed") or r.get("wrong")]
    print(f"{len(rows)} cases, {len(bad)} with a hang, an error, a disagreement or a wrong result")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
