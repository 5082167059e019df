"""Fault drill: kill ranks in the middle of collectives and measure how the survivors
get back to work with ``Communicator.shrink()``.

    python bench/fault_drill.py                       # N = 2, 4, 8 on shm and tcp, each failure
    python bench/fault_drill.py --sizes 4 --transports tcp --failures kill --trials 10
    python bench/fault_drill.py --hosts 4 --sizes 4,8 --transports auto   # 4 emulated hosts (root)
    python bench/fault_drill.py --sizes 4,8 --transports tcp --fresh-links   # every link anew

For every case (transport, N, how the victim fails, where), N ranks loop a collective
on 1 MiB of float32 (``--where all_reduce`` or ``broadcast``); after a random 0.2-0.6 s
the victim(s) fail. ``--where init``: a rank fails before it joins, and the others'
``init`` must fail naming it; ``shrink``: a second rank dies during the survivors'
shrink, which must still end with both excluded; ``join``: the N ranks grow by one and
the newcomer fails once it has its seat: the grow must fail naming it and the members'
communicator must still compute right. How the victims fail:

- ``kill``: SIGKILL (no goodbye); ``exit``: ``os._exit(3)`` without closing anything;
- ``stop``: SIGSTOP (alive but silent: the survivors notice at their timeout,
  ``--timeout``, and the agreement counts it dead when it does not check in);
- ``partition`` (``--hosts`` equal to N: one rank per emulated host): the victim takes
  its host's link down (no FIN, no RST: packets just stop) and stays alive; the
  survivors notice when its machine has answered no TCP keepalive probe for
  ``--keepalive`` seconds (RINGREDUCE_TCP_KEEPALIVE), or at their timeout if sooner.

Each survivor reports when its call raised PeerError or TimeoutError (*detection*, from
the moment the victim failed), how long ``shrink()`` took (*shrink*), and whether an
all_reduce on the shrunk communicator matches numpy. The table gives, per case, the
worst survivor: detection, shrink, detection to a usable shrunk communicator, the
calls lost (the one in flight), wrong results and hangs (a rank that did not finish
within ``--case-timeout``), and where the slowest survivor's shrink went: its
agreement(s), making the new communicator (meeting, links), and arming it (reading the
standby stores' addresses), how many TCP links of the shrunk ring the survivors took
over from the old one and made anew, and how many pairs of them on one host kept their
shared memory (``--fresh-links``: all made anew, the way to measure what keeping them
saves). ``--json`` writes every survivor's report.
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

    rank, n, port, transport, victims, how, where, delay, timeout, master = argv
    rank, n = int(rank), int(n)
    if os.environ.get("RR_DRILL_FRESH_LINKS") == "1":
        from ringreduce._comm.membership import agreement as membership

        membership._REUSE_LINKS = False  # --fresh-links: every link of the shrunk ring anew
    victims = [int(v) for v in victims.split(",")]
    if where == "init" and rank in victims:
        fail(rank, how)  # before it joins: the others' init must fail, naming it
    if where == "join" and rank == n:
        newcomer(port, how, master)
    started = time.monotonic()
    try:
        comm = rr.init(
            transport,
            rank=rank,
            world_size=n,
            master_addr=master,
            master_port=int(port),
            timeout=float(timeout),
        )
    except rr.RingReduceError as exc:
        named = [v for v in victims if f"rank {v} " in str(exc)]
        report = {
            "rank": rank,
            "detected": time.time(),
            "kind": type(exc).__name__,
            "shrink_s": 0.0,
            "calls": 0,
            "failed_ranks": named,
            "new_size": 0,
            "ok": True,
            "init_s": time.monotonic() - started,
        }
        print(json.dumps(report), flush=True)
        return
    x = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    comm.all_reduce(x, out=x)
    x[:] = 1
    print(json.dumps({"rank": rank, "ready": time.time()}), flush=True)
    if where == "join":
        grow_with_a_dying_newcomer(comm, rank, n)
        return
    start = time.monotonic()
    calls = 0
    # "shrink": the first victim dies in the loop, the second during the shrink that follows.
    dying = victims[:1] if where == "shrink" else victims
    try:
        while True:
            if rank in dying and time.monotonic() - start > float(delay):
                fail(rank, how)
            if where == "broadcast":
                comm.broadcast(x, root=calls % n)
            else:
                comm.all_reduce(x, out=x)
                x[:] = 1
            calls += 1
    except (rr.PeerError, rr.TimeoutError) as exc:
        detected = time.time()
        kind = type(exc).__name__
        reason = getattr(exc, "reason", None)  # "unreachable": its machine answered nothing
        message = str(exc)[:300]
    if where == "shrink" and rank in victims[1:]:
        die_during_shrink(rank, how, random.choice(("agree", "make", "arm")))
    phases = time_phases()
    t0, cpu0 = time.monotonic(), time.process_time()
    new = comm.shrink()
    shrink_s = time.monotonic() - t0
    cpu_s = time.process_time() - cpu0  # every thread of this rank's process
    got = new.all_reduce(np.full(1000, new.rank + 1.0))
    ok = bool(np.all(got == new.world_size * (new.world_size + 1) / 2))
    stats = new.stats()
    report = {
        "links": [stats["tcp_links_reused"], stats["tcp_links_connected"]],
        "shm_kept": stats["shm_peers_reused"],
        "rank": rank,
        "detected": detected,
        "kind": kind,
        "reason": reason,
        "message": message,
        "shrink_s": shrink_s,
        "cpu_s": cpu_s,
        "agree_s": phases["agree"],
        "arm_s": phases["arm"],
        "calls": calls,
        "failed_ranks": sorted(comm.failed_ranks),
        "new_size": new.world_size,
        "ok": ok,
    }
    print(json.dumps(report), flush=True)
    new.close()
    comm.close()


def time_phases() -> Dict[str, float]:
    """Seconds a shrink spends in its agreement(s) and in arming the new communicator
    (its standby stores' addresses read from every rank), summed over its attempts; the
    rest of it is making the new communicator (meeting, links). Filled in as it runs."""
    from ringreduce._comm.membership import agreement as membership

    spent = {"agree": 0.0, "arm": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.monotonic() - t0

        return run

    membership.Membership.agree = timed("agree", membership.Membership.agree)
    membership.arm = timed("arm", membership.arm)
    return spent


def die_during_shrink(rank: int, how: str, phase: str) -> None:
    """Makes this rank fail inside its next shrink: as it enters the agreement ("agree"),
    once the agreement has counted it in ("make": the others then make a communicator
    with it), or once that communicator's links are up ("arm"). A shrink takes tens of
    milliseconds, so a timer would often fire after it, a failure of another kind."""
    from ringreduce._comm.membership import agreement as membership

    agree = membership.Membership.agree
    if phase == "arm":
        membership.arm = lambda *args, **kwargs: fail(rank, how)
        return

    def agree_then_fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        if phase == "agree":
            fail(rank, how)
        decision = agree(self, *args, **kwargs)
        fail(rank, how)
        return decision

    membership.Membership.agree = agree_then_fail


def fail(rank: int, how: str) -> None:
    print(json.dumps({"rank": rank, "failed_at": time.time()}), flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)  # the driver kills it
    elif how == "partition":
        # This rank's host off the network, from inside its namespace; the driver
        # brings the link back up after the case, and kills this process.
        subprocess.run(["ip", "link", "set", os.environ["RR_DRILL_DEV"], "down"], check=True)
        time.sleep(3600)
    os._exit(3)


def newcomer(port: str, how: str, master: str) -> None:
    """A newcomer that takes its seat in the members' grow, then fails."""
    import ringreduce as rr
    from ringreduce._comm.membership import growth

    take = growth._take_seat

    def take_and_fail(store: Any, info: Any, standby: str) -> Any:
        seat = take(store, info, standby)
        fail(seat, how)

    growth._take_seat = take_and_fail
    rr.join(timeout=60, master_addr=master, master_port=int(port))
    os._exit(4)  # not reached: it fails once seated


def grow_with_a_dying_newcomer(comm: Any, rank: int, n: int) -> None:
    """The members grow by one; the newcomer dies while joining. The grow fails naming
    it, and the members' communicator must still compute right."""
    import numpy as np

    import ringreduce as rr

    t0 = time.monotonic()
    try:
        comm.grow(n + 1)
        named, kind = [], "grew"
    except rr.RingReduceError as exc:
        named, kind = ([n] if f"rank {n} " in str(exc) else []), type(exc).__name__
    detected = time.time()
    got = comm.all_reduce(np.full(1000, comm.rank + 1.0))
    ok = bool(np.all(got == n * (n + 1) / 2))
    print(
        json.dumps(
            {
                "rank": rank,
                "detected": detected,
                "kind": kind,
                "shrink_s": 0.0,
                "calls": 0,
                "failed_ranks": named,
                "new_size": n,
                "ok": ok,
                "grow_s": time.monotonic() - t0,
            }
        ),
        flush=True,
    )
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
    count = n + 1 if where == "join" else n  # "join": rank n is the newcomer
    hosts = args.hosts
    master = f"{_SUBNET}.1" if hosts else "127.0.0.1"

    def host_of(r: int) -> int:  # contiguous ranks per host; the newcomer on the last
        return min(r, n - 1) * hosts // n

    def wrap(r: int) -> List[str]:
        return ["ip", "netns", "exec", f"{args.netns}{host_of(r)}"] if hosts else []

    def env_of(r: int) -> Dict[str, str]:
        env = dict(os.environ)
        if args.keepalive is not None:
            env["RINGREDUCE_TCP_KEEPALIVE"] = str(args.keepalive)
        env["RR_DRILL_FRESH_LINKS"] = "1" if args.fresh_links else "0"
        if hosts:
            env.update(
                RINGREDUCE_HOST_ID=f"drill-host-{host_of(r)}", RR_DRILL_DEV=f"dveth{host_of(r)}"
            )
        return env

    procs = [
        subprocess.Popen(
            [
                *wrap(r),
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
                master,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_of(r),
        )
        for r in range(count)
    ]
    deadline = time.monotonic() + args.case_timeout
    reports: Dict[int, Dict[str, Any]] = {}
    failed_at: Optional[float] = None
    hung, errors = [], []
    for r, p in enumerate(procs):
        if r in victims and how in ("stop", "partition"):
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
    if how == "partition":
        for h in {host_of(v) for v in victims}:
            subprocess.run(
                ["ip", "-n", f"{args.netns}{h}", "link", "set", f"dveth{h}", "up"], check=True
            )
    survivors = [r for r in range(count) if r not in victims]
    row: Dict[str, Any] = {
        "transport": transport,
        "n": n,
        "how": how,
        "where": where,
        "victims": victims,
        "survivors": len(survivors),
        "reported": len(reports),
        "hung": hung,
        "errors": errors,
    }
    if failed_at is not None and reports:
        detect = [rep["detected"] - failed_at for rep in reports.values()]
        shrink = [rep["shrink_s"] for rep in reports.values()]
        usable = [rep["detected"] + rep["shrink_s"] - failed_at for rep in reports.values()]
        cpu = [rep.get("cpu_s", 0.0) for rep in reports.values()]
        slowest = max(reports.values(), key=lambda rep: rep["shrink_s"])
        agree_s, arm_s = slowest.get("agree_s", 0.0), slowest.get("arm_s", 0.0)
        agreed = {tuple(rep["failed_ranks"]) for rep in reports.values()}
        row.update(
            detect_s=max(detect),
            shrink_s=max(shrink),
            shrink_median_s=statistics.median(shrink),
            usable_s=max(usable),
            # From the last survivor's detection to every survivor's usable communicator:
            # the repair alone (a shrink call's time also holds waiting for the last to
            # learn of the failure, which a ring passes on rank by rank).
            repair_s=max(usable) - max(detect),
            # CPU a shrink costs a rank (all its threads): the median, and the busiest
            # (the agreement's host). With more ranks than cores, the wall time is
            # bound by their sum over the cores.
            cpu_median_s=statistics.median(cpu),
            cpu_max_s=max(cpu),
            wrong=sum(not rep["ok"] for rep in reports.values()),
            phases=(agree_s, slowest["shrink_s"] - agree_s - arm_s, arm_s),
            agreed=len(agreed) == 1 and agreed == {tuple(sorted(victims))},
            lost_calls=1,
            # Links of the shrunk ring kept and made (each counted by both its ends).
            links=[
                sum(rep.get("links", [0, 0])[i] for rep in reports.values()) // 2 for i in (0, 1)
            ],
            # Pairs of local survivors whose shared memory was kept (each counted by both).
            shm_kept=sum(rep.get("shm_kept", 0) for rep in reports.values()) // 2,
        )
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
    p.add_argument(
        "--where",
        default="all_reduce",
        help="all_reduce, broadcast, init, shrink (a second rank dies during the "
        "shrink), join (a newcomer dies while joining a grow)",
    )
    p.add_argument("--victims", type=int, default=1, help="ranks failing at once (default 1)")
    p.add_argument("--at", help="these ranks fail (default: --victims ranks at random)")
    p.add_argument("--trials", type=int, default=3, help="per case (default 3)")
    p.add_argument("--timeout", type=float, default=3.0, help="communicator timeout, s")
    p.add_argument("--case-timeout", type=float, default=60.0, help="a hang after this, s")
    p.add_argument("--keepalive", type=int, help="RINGREDUCE_TCP_KEEPALIVE for the ranks, s")
    p.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="emulated hosts: network namespaces on a bridge, links shaped to "
        "--link (root; 0: every rank on loopback)",
    )
    p.add_argument("--link", default="10gbit", help="with --hosts: tc tbf rate (10gbit)")
    p.add_argument(
        "--netns",
        default="rrdrill",
        help="with --hosts: the namespaces' names, NETNS0.. and NETNSsw (rrdrill); "
        "drills run at once need their own",
    )
    p.add_argument(
        "--fresh-links",
        action="store_true",
        help="shrink makes every TCP link of the new ring anew instead of taking "
        "over the parked ones (to measure what that saves)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    random.seed(args.seed)
    if args.hosts:
        bench, switch = _emulated_hosts(), f"{args.netns}sw"
        bench.hosts_down(args.hosts, args.netns, switch)
        bench.hosts_up(args.hosts, args.link, args.netns, switch, _SUBNET, dev="d")
        try:
            return _drill(args)
        finally:
            bench.hosts_down(args.hosts, args.netns, switch)
    return _drill(args)


_SUBNET = "10.234.0"


def _emulated_hosts() -> Any:
    """bench/compression.py's hosts_up/hosts_down (namespaces on a bridge, tc tbf)."""
    sys.path.insert(0, os.path.dirname(HERE))
    import compression

    return compression


def _drill(args: argparse.Namespace) -> int:
    rows = []
    print(
        "| transport | N | failure | where | victims | detection | shrink (worst / median) "
        "| worst: agree / make / arm | TCP links kept / made | shm pairs kept "
        "| detection to usable | agreed | wrong | hangs |"
    )
    print("|---|---:|---|---|---|---:|---:|---|---|---:|---:|---|---:|---:|")
    for transport in args.transports.split(","):
        for n in [int(v) for v in args.sizes.split(",")]:
            for how in args.failures.split(","):
                for where in args.where.split(","):
                    for _ in range(args.trials):
                        victims = random.sample(range(n), min(args.victims, n - 1))
                        if where == "shrink":
                            if n < 3:
                                continue  # two must die and one survive
                            victims = random.sample(range(n), 2)
                        if args.at:
                            victims = [int(v) for v in args.at.split(",")]
                        if where == "join":
                            victims = [n]  # the newcomer
                        if how == "partition" and (args.hosts != n or len(victims) != 1):
                            print(
                                f"| {transport} | {n} | partition | {where} | {victims} | "
                                "skipped: needs --hosts N (one rank per host) and one "
                                "victim |",
                                flush=True,
                            )
                            break
                        row = run_case(n, transport, how, where, sorted(victims), args)
                        rows.append(row)
                        if "detect_s" in row:
                            ms = {k: f"{row[k] * 1e3:.0f} ms" for k in row if k.endswith("_s")}
                            cells = [
                                transport,
                                n,
                                how,
                                where,
                                row["victims"],
                                ms["detect_s"],
                                f"{ms['shrink_s']} / {ms['shrink_median_s']}",
                                " / ".join(f"{v * 1e3:.0f}" for v in row["phases"]),
                                " / ".join(map(str, row["links"])),
                                row["shm_kept"],
                                ms["usable_s"],
                                row["agreed"],
                                row["wrong"],
                                len(row["hung"]),
                            ]
                            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                        else:
                            print(
                                f"| {transport} | {n} | {how} | {where} | {row['victims']} "
                                f"| no report | | | | | | | | {len(row['hung'])} "
                                f"| {row['errors']}",
                                flush=True,
                            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["hung"] or r["errors"] or not r.get("agreed") or r.get("wrong")]
    print(f"{len(rows)} cases, {len(bad)} with a hang, an error, a disagreement or a wrong result")
    if args.trials > 1:
        summarize(rows)
    return 1 if bad else 0


def summarize(rows: List[Dict[str, Any]]) -> None:
    """Per transport, N, failure and place: the median and range over the trials. On a
    busy machine the worst of a few trials moves from run to run by more than most
    changes do; the median moves less."""

    def spread(values: List[float]) -> str:
        ms = sorted(v * 1e3 for v in values)
        return f"{statistics.median(ms):.0f} ms ({ms[0]:.0f}-{ms[-1]:.0f})"

    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in rows:
        if "detect_s" in row:
            key = (row["transport"], row["n"], row["how"], row["where"])
            groups.setdefault(key, []).append(row)
    print()
    print(
        "| transport | N | failure | where | cases | detection, median (range) "
        "| shrink, median (range) | repair, median | agree / make / arm, medians "
        "| CPU per rank, median / busiest | TCP links kept / made, medians |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---|---|---|")
    for (transport, n, how, where), group in groups.items():
        phases = " / ".join(
            f"{statistics.median(r['phases'][i] for r in group) * 1e3:.0f}" for i in range(3)
        )
        links = " / ".join(f"{statistics.median(r['links'][i] for r in group):g}" for i in range(2))
        ms = {
            k: statistics.median(r[k] for r in group) * 1e3
            for k in ("repair_s", "cpu_median_s", "cpu_max_s")
        }
        cpu = f"{ms['cpu_median_s']:.1f} / {ms['cpu_max_s']:.1f} ms"
        cells = [
            transport,
            n,
            how,
            where,
            len(group),
            spread([r["detect_s"] for r in group]),
            spread([r["shrink_s"] for r in group]),
            f"{ms['repair_s']:.0f} ms",
            phases,
            cpu,
            links,
        ]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
