"""Soak: many mixed collectives and communicator churn; do memory, fds or threads grow?

    python bench/soak.py -n 4 --calls 100000
    python bench/soak.py -n 4 --calls 5000 --churn-every 500 --transport shm
    python bench/soak.py --calls 20000 --churn-every 500 --churn-transport shm --churn-store reuse

N local ranks run ``--calls`` collectives each, chosen by one seeded sequence that every
rank draws alike: all_reduce (blocking, in place, async), reduce_scatter, all_gather,
broadcast, reduce, barrier, on float32/float64/float16/int32/int64/int8 arrays of 1 to
2^20 elements (large ones rarely). Every result is checked (the inputs are small
integers, so sums are exact). Every ``--churn-every`` calls each rank also creates a
second communicator (file-store rendezvous, over ``--churn-transport``, by default the
main one's), runs one all_reduce on it and closes it. ``--churn-store reuse`` has every
churn communicator meet in one store directory, as a job that reuses its store_dir does
(with shared memory, that once ended in SIGBUS); ``fresh`` (the default) gives each its
own.

Ranks run with Python's faulthandler on; each rank's stderr goes to a file, shown (its
last lines) when the rank fails, and the report gives each rank's exit status, naming
the signal (SIGBUS, SIGSEGV, ...) of one that a signal killed. ``--log-dir`` keeps the
files; without it they are kept only when a rank fails.

Each rank samples its resident memory (RSS), open file descriptors and OS threads after
the warm-up (``--warmup`` calls, default 10% of the calls) and at the end; the table
shows both and the growth, and the RSS every ~10% of the calls in between (a leak
climbs steadily; the allocator keeping one more large buffer is a single step).
Pass: RSS grows < 10% after warm-up, fds and threads not at all, no wrong result.

glibc raises its mmap threshold each time a large block is freed, so later buffers of
that size come from the heap, which keeps them: RSS then steps up once by about one
large buffer (8 MiB here). ``--mmap-threshold 131072`` fixes the threshold
(MALLOC_MMAP_THRESHOLD_) so that what remains is ringreduce's own memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from ringreduce.launch import free_port

DTYPES = ["float32", "float64", "float16", "int32", "int64", "int8"]
# Element counts and how often each is drawn: mostly small, rarely 4 MB.
SIZES = [(1, 20), (7, 20), (1000, 25), (65536, 25), (1 << 20, 3)]
KINDS = [
    "all_reduce",
    "all_reduce_inplace",
    "all_reduce_async",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "barrier",
]


def _sample() -> Dict[str, float]:
    """This process's RSS (MiB), open fds and OS threads."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(status["Threads"]),
    }


def _one_call(comm, kind: str, x, i: int, total: int) -> bool:
    """One collective of the given kind on x (every rank's x is full of rank + 1);
    whether its result is right."""
    import numpy as np

    n = comm.world_size
    if kind == "all_reduce":
        return bool(np.all(comm.all_reduce(x) == total))
    if kind == "all_reduce_inplace":
        comm.all_reduce(x, out=x)
        return bool(np.all(x == total))
    if kind == "all_reduce_async":
        return bool(np.all(comm.all_reduce(x, op="max", async_op=True).wait() == n))
    if kind == "reduce_scatter":
        return bool(np.all(comm.reduce_scatter(x) == total))
    if kind == "all_gather":
        got = comm.all_gather(x[:1000])
        return bool(np.array_equal(got[:, 0], np.arange(1, n + 1)))
    if kind == "broadcast":
        return bool(np.all(comm.broadcast(x, root=i % n) == i % n + 1))
    if kind == "reduce":
        got = comm.reduce(x, root=i % n)
        return got is None or bool(np.all(got == total))
    comm.barrier()
    return True


def _churn(args: argparse.Namespace, label, rank: int, n: int) -> bool:
    """A second communicator (file-store rendezvous): made, used once, closed."""
    import numpy as np

    import ringreduce as rr

    name = "churn" if args.churn_store == "reuse" else f"churn-{label}"
    store = os.path.join(args.store_root, name)
    transport = args.churn_transport or args.transport
    with rr.init(
        transport, rank=rank, world_size=n, store_dir=store, timeout=args.timeout
    ) as extra:
        return bool(np.all(extra.all_reduce(np.ones(16, dtype=np.int32)) == n))


def _rank_main(args: argparse.Namespace) -> None:
    import numpy as np

    import ringreduce as rr

    comm = rr.init(args.transport, timeout=args.timeout)
    n, r = comm.world_size, comm.rank
    rng = random.Random(args.seed)  # the same draws on every rank
    sizes, weights = zip(*SIZES)
    warmup = args.warmup if args.warmup is not None else max(1, args.calls // 10)
    wrong: List[str] = []
    samples: Dict[str, dict] = {}
    churned = 0
    total = n * (n + 1) // 2  # sum over ranks of rank + 1
    # Prime: every kind of call at the largest size, and one churn, before the warm-up
    # calls, so that the first sample already holds every buffer a call may need.
    for kind in KINDS:
        _one_call(comm, kind, np.full(sizes[-1], r + 1, dtype=np.float64), 0, total)
    if args.churn_every:
        _churn(args, "prime", r, n)
    start = time.monotonic()
    for i in range(args.calls):
        if i == warmup:
            samples["warmup"] = _sample()
        if i > warmup and (i - warmup) % max(1, (args.calls - warmup) // 10) == 0:
            samples.setdefault("trend", []).append(_sample()["rss_mib"])
        kind = rng.choice(KINDS)
        dtype = rng.choice(DTYPES)
        count = rng.choices(sizes, weights)[0]
        x = np.full(count, r + 1, dtype=dtype)
        ok = _one_call(comm, kind, x, i, total)
        if not ok:
            wrong.append(f"call {i}: {kind} {dtype} x{count}")
        if args.churn_every and (i + 1) % args.churn_every == 0:
            if not _churn(args, churned, r, n):
                wrong.append(f"churn {churned}: wrong all_reduce")
            churned += 1
    comm.barrier()
    samples["end"] = _sample()
    seconds = time.monotonic() - start
    print(
        json.dumps(
            {
                "rank": r,
                "samples": samples,
                "wrong": wrong[:20],
                "wrong_count": len(wrong),
                "churned": churned,
                "seconds": seconds,
                "warmup": warmup,
            }
        ),
        flush=True,
    )
    comm.close()


def _growth(before: float, after: float) -> str:
    return f"{100.0 * (after - before) / before:+.1f}%" if before else "n/a"


def _exit_status(code: Optional[int]) -> str:
    """A return code in words: "0", "1", or the signal's name ("SIGBUS")."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


def _tail(path: str, lines: int) -> List[str]:
    with open(path, errors="replace") as f:
        return f.read().splitlines()[-lines:]


def _wait_all(procs: List[subprocess.Popen], grace: float) -> List[str]:
    """Waits for every rank. Once one fails, the others get ``grace`` seconds to fail
    too (naming the culprit in their errors) before they are killed. Returns, per
    rank, "" or the soak's own note ("killed by the soak after rank 2 failed")."""
    notes = [""] * len(procs)
    failed_at: Optional[float] = None
    first = -1
    while any(q.poll() is None for q in procs):
        for rank, q in enumerate(procs):
            if failed_at is None and q.poll() not in (None, 0):
                failed_at, first = time.monotonic(), rank
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for rank, q in enumerate(procs):
                if q.poll() is None:
                    q.kill()
                    q.wait()
                    notes[rank] = f"killed by the soak {grace:.0f} s after rank {first} failed"
            break
        time.sleep(0.2)
    return notes


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--calls", type=int, default=100000, help="collectives per rank")
    p.add_argument("--warmup", type=int, default=None, help="calls before the first sample")
    p.add_argument(
        "--churn-every",
        type=int,
        default=1000,
        help="a second communicator made and closed every this many calls (0: never; default 1000)",
    )
    p.add_argument("--transport", default="auto", choices=["tcp", "shm", "auto"])
    p.add_argument(
        "--churn-transport",
        default=None,
        choices=["tcp", "shm", "auto"],
        help="the churn communicators' transport (default: --transport)",
    )
    p.add_argument(
        "--churn-store",
        default="fresh",
        choices=["fresh", "reuse"],
        help="fresh: a new store directory per churn communicator (default); "
        "reuse: one directory for all of them",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="MALLOC_MMAP_THRESHOLD_ for the ranks (0: glibc's own policy)",
    )
    p.add_argument(
        "--log-dir",
        default=None,
        help="keep each rank's stdout and stderr here (default: a temporary "
        "directory, kept only when a rank fails)",
    )
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store-root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_worker:
        _rank_main(args)
        return 0
    n = args.nprocs
    port = free_port()
    procs = []
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="rr-soak-logs-")
    outs = [os.path.join(log_dir, f"rank{rank}.stdout") for rank in range(n)]
    errs = [os.path.join(log_dir, f"rank{rank}.stderr") for rank in range(n)]
    with tempfile.TemporaryDirectory(prefix="rr-soak-") as tmp:
        for rank in range(n):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RINGREDUCE_PORT=str(port),
            )
            if args.mmap_threshold:
                env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
            # -X faulthandler: a rank that dies of a signal leaves its Python traceback.
            cmd = [
                sys.executable,
                "-X",
                "faulthandler",
                os.path.abspath(__file__),
                "--rank-worker",
                "--store-root",
                tmp,
                "--calls",
                str(args.calls),
                "--churn-every",
                str(args.churn_every),
                "--transport",
                args.transport,
                "--churn-store",
                args.churn_store,
                "--seed",
                str(args.seed),
                "--timeout",
                str(args.timeout),
            ]
            if args.churn_transport:
                cmd += ["--churn-transport", args.churn_transport]
            if args.warmup is not None:
                cmd += ["--warmup", str(args.warmup)]
            with open(outs[rank], "w") as out, open(errs[rank], "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env))
        try:
            notes = _wait_all(procs, grace=args.timeout + 10)
        finally:
            for q in procs:  # Ctrl-C: no rank outlives the soak
                if q.poll() is None:
                    q.kill()
                    q.wait()
    codes = [q.returncode for q in procs]
    reports: List[Optional[dict]] = []
    for rank in range(n):
        with open(outs[rank]) as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
        reports.append(json.loads(lines[-1]) if lines else None)
    churn = f" --churn-transport {args.churn_transport}" if args.churn_transport else ""
    churn += f" --churn-store {args.churn_store}" if args.churn_store != "fresh" else ""
    threshold = f" --mmap-threshold {args.mmap_threshold}" if args.mmap_threshold else ""
    print(
        f"# python bench/soak.py -n {n} --calls {args.calls} --churn-every "
        f"{args.churn_every} --transport {args.transport}{churn} --seed {args.seed}"
        f"{threshold}"
    )
    if any(code != 0 for code in codes) or any(rep is None for rep in reports):
        print("FAIL: a rank did not finish")
        for rank in range(n):
            print(
                f"rank {rank}: exit {_exit_status(codes[rank])}"
                f"{' (' + notes[rank] + ')' if notes[rank] else ''}"
                f"{'' if reports[rank] else ', no report'}"
            )
            for line in _tail(errs[rank], 25):
                print(f"      {line}")
        print(f"each rank's stdout and stderr: {log_dir}")
        return 1
    done: List[dict] = [rep for rep in reports if rep is not None]
    seconds = max(rep["seconds"] for rep in done)
    print(
        f"{args.calls} collectives per rank in {seconds:.1f} s "
        f"({args.calls / seconds:.0f}/s), warm-up {done[0]['warmup']} calls, "
        f"{done[0]['churned']} communicators made and closed per rank"
    )
    print(
        f"{'rank':>4}  {'RSS MiB warm/end':>18} {'growth':>8}  {'fds warm/end':>13}  "
        f"{'threads warm/end':>17}  wrong  exit  stderr"
    )
    ok = True
    for rep, code, err in zip(done, codes, errs):
        w, e = rep["samples"]["warmup"], rep["samples"]["end"]
        growth = (e["rss_mib"] - w["rss_mib"]) / w["rss_mib"]
        ok &= growth < 0.10 and e["fds"] <= w["fds"] and e["threads"] <= w["threads"]
        ok &= rep["wrong_count"] == 0
        err_lines = len(_tail(err, 1 << 30))
        print(
            f"{rep['rank']:>4}  {w['rss_mib']:8.1f} / {e['rss_mib']:7.1f} "
            f"{_growth(w['rss_mib'], e['rss_mib']):>8}  {w['fds']:>5} / {e['fds']:<5}  "
            f"{w['threads']:>7} / {e['threads']:<7}  {rep['wrong_count']:>5}  "
            f"{_exit_status(code):>4}  {err_lines} lines"
        )
        trend = rep["samples"].get("trend", []) + [e["rss_mib"]]
        print(
            f"      RSS MiB every ~10% of the calls after warm-up: "
            f"{' '.join(f'{v:.1f}' for v in trend)}"
        )
        for line in rep["wrong"][:3]:
            print(f"      wrong: {line}")
        for line in _tail(err, 3):
            print(f"      stderr: {line}")
    print("PASS" if ok else "FAIL", "(RSS growth < 10%, no fd or thread growth, no wrong result)")
    if args.log_dir or not ok:
        print(f"each rank's stdout and stderr: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
