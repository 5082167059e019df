"""How long ``rr.init`` takes, and how much it asks of rank 0's rendezvous store.

N local ranks (processes started ahead, released at once) meet at rank 0's TCP store on
loopback. Per trial: the slowest rank's ``init`` (from its own release to its return)
and the TCP segments this host sent meanwhile (``/proc/net/snmp``: the store's traffic,
and the links' when the transport is TCP). ``--stagger S`` releases rank r S*r seconds
after rank 0, as ranks that a launcher starts one after another.

    python bench/init_time.py --sizes 4,8 --trials 5
    python bench/init_time.py --sizes 8 --stagger 0.02 --transport tcp
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time


def _tcp_segments_sent() -> int:
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, size, port, transport, delay, go, results) -> None:
    import ringreduce as rr

    go.wait()
    time.sleep(delay)
    start = time.perf_counter()
    comm = rr.init(
        transport, rank=rank, world_size=size, master_addr="127.0.0.1", master_port=port, timeout=60
    )
    results.put(time.perf_counter() - start)
    comm.barrier()
    comm.close()


def trial(ctx, size: int, transport: str, stagger: float) -> tuple:
    """(the slowest rank's init in seconds, TCP segments sent meanwhile)."""
    go, results, port = ctx.Event(), ctx.Queue(), _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, size, port, transport, r * stagger, go, results))
        for r in range(size)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process up and waiting
    before = _tcp_segments_sent()
    go.set()
    slowest = max(results.get(timeout=120) for _ in range(size))
    sent = _tcp_segments_sent() - before
    for p in procs:
        p.join(60)
    return slowest, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,8")
    parser.add_argument("--transport", default="shm", help="shm, tcp or auto")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between releases")
    args = parser.parse_args()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["ringreduce", "numpy"])
    print("| transport | N | stagger | init, slowest rank: median (range) | TCP segments |")
    print("|---|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        runs = [trial(ctx, size, args.transport, args.stagger) for _ in range(args.trials)]
        ms = [r[0] * 1e3 for r in runs]
        segs = [r[1] for r in runs]
        print(
            f"| {args.transport} | {size} | {args.stagger * 1e3:g} ms | "
            f"{statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f}) | "
            f"{statistics.median(segs):.0f} ({min(segs)}-{max(segs)}) |"
        )


if __name__ == "__main__":
    main()
