"""One process of a job that takes newcomers (tests/test_grow.py):

    python _grow_rank.py ROLE RANK SIZE PORT TRANSPORT HOSTS SCENARIO TOKEN

ROLE "member": one of SIZE ranks made by init(); "newcomer": a process that calls
join() (RANK and SIZE are then the rank it expects and the size after the grow).
SCENARIO:
- "grow=G": the members grow to G ranks; the newcomers join; everyone checks an
  all_reduce on the grown communicator and receives the members' state (share_state).
- "shrink=V,grow=G": rank V (old numbering) dies in an all_reduce loop, the survivors
  shrink, then grow to G.
- "seat-then-die,grow=G": the first newcomer takes its seat and dies; the members' grow
  fails naming it, their communicator still works, and they grow again (a second
  newcomer joins that one).
- "buckets,grow=G": the members reduce a step of gradients with a GradientBucketer
  (buckets in windows where the ranks share a host), grow, hand the state over, then
  ``adopt`` the grown communicator; the newcomers make their bucketer on it; everyone
  reduces a step there.
A newcomer whose TOKEN is "wrong" expects AuthenticationError. Prints one JSON line.
Everyone meets at GROW_TEST_ADDR (default 127.0.0.1) and PORT.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from _victims import check, fail_in_loop

ADDR = os.environ.get("GROW_TEST_ADDR", "127.0.0.1")


def state_of(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((37, 11)).astype(np.float32),
        "b": rng.standard_normal(5),  # float64
        "step": np.array([seed], dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def after_grow(grown, holder: bool) -> dict:
    state = grown.share_state(state_of(7) if holder else None)
    same = all(np.array_equal(state[k], v) for k, v in state_of(7).items())
    return {"rank": grown.rank, "size": grown.world_size, "ok": check(grown), "state": same}


def bucketer_for(comm):
    """A bucketer of two parameters, one per bucket (the second above the window path's
    small-call size)."""
    b = rr.GradientBucketer(comm, bucket_mb=0.01, first_bucket_mb=0.001)
    b.register("a", (1000,), np.float32)
    b.register("b", (5000,), np.float32)
    return b


def bucket_step(b, comm) -> dict:
    """One step: rank r hands over gradients of r + 1; returns whether every result is
    the mean over the ranks, and the window calls it made."""
    before = comm.stats()["all_reduce_algorithms"].get("window", 0)
    grads = [np.full(1000, comm.rank + 1, np.float32), np.full(5000, comm.rank + 1, np.float32)]
    for handle in (1, 0):  # backward order
        b.ready(handle, grads[handle])
    b.wait()
    mean = (comm.world_size + 1) / 2
    return {
        "mean": all(bool((g == mean).all()) for g in grads),
        "windows": comm.stats()["all_reduce_algorithms"].get("window", 0) - before,
    }


def die_in_loop(comm, rank: int, victim: int) -> None:
    exc = fail_in_loop(comm, rank, victim, after=0.2, elems=1 << 14)
    if exc is not None and not isinstance(exc, rr.PeerError):
        raise exc


def member(rank: int, size: int, port: int, transport: str, scenario: dict, token: str) -> dict:
    comm = rr.init(
        transport,
        rank=rank,
        world_size=size,
        master_addr=ADDR,
        master_port=port,
        timeout=6 if "seat-then-die" in scenario else 15,
        token=token,
    )
    report: dict = {"member": rank}
    if "shrink" in scenario:
        die_in_loop(comm, rank, int(scenario["shrink"]))
        new = comm.shrink()
        comm.close()
        comm = new
        report["shrunk"] = comm.world_size
    if "seat-then-die" in scenario:
        start = time.monotonic()
        try:
            comm.grow(int(scenario["grow"]), timeout=4)
            report["first"] = "grew"
        except rr.RingReduceError as exc:
            report["first"] = f"{type(exc).__name__}: {exc}"
        report["first_s"] = time.monotonic() - start
        report["old_ok"] = check(comm)
    bucketer = None
    if "buckets" in scenario:
        bucketer = bucketer_for(comm)
        report["before"] = bucket_step(bucketer, comm)
    start = time.monotonic()
    grown = comm.grow(int(scenario["grow"]))
    report["grow_s"] = time.monotonic() - start
    report.update(after_grow(grown, holder=True))
    if bucketer is not None:
        bucketer.adopt(grown)
        report["after"] = bucket_step(bucketer, grown)
        report["generation"] = bucketer.generation()
    report["old_ok"] = report.get("old_ok", True) and check(comm)
    grown.close()
    comm.close()
    return report


def newcomer(port: int, scenario: dict, token: str) -> dict:
    if token == "wrong":
        try:
            rr.join(timeout=10, master_addr=ADDR, master_port=port, token=token)
            return {"newcomer": "joined with a wrong token"}
        except rr.AuthenticationError as exc:
            return {"newcomer": "refused", "error": str(exc)}
    if "seat-then-die" in scenario and os.environ.get("GROW_TEST_DIE") == "1":
        from ringreduce._comm.membership import growth

        take = growth._take_seat

        def take_and_die(store, info, standby):
            take(store, info, standby)
            os.kill(os.getpid(), signal.SIGKILL)

        growth._take_seat = take_and_die
    grown = rr.join(timeout=30, master_addr=ADDR, master_port=port, token=token)
    report = {"newcomer": grown.rank}
    report.update(after_grow(grown, holder=False))
    if "buckets" in scenario:
        bucketer = bucketer_for(grown)
        report["after"] = bucket_step(bucketer, grown)
        report["generation"] = bucketer.generation()
    grown.close()
    return report


def main() -> None:
    role, rank, size, port, transport, hosts, scenario, token = sys.argv[1:9]
    rank, size, port, hosts = int(rank), int(size), int(port), int(hosts)
    if hosts:
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank % hosts}"
    parsed = dict(part.partition("=")[::2] for part in scenario.split(","))
    if role == "member":
        report = member(rank, size, port, transport, parsed, token)
    else:
        report = newcomer(port, parsed, token)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    import numpy as np

    import ringreduce as rr

    main()
