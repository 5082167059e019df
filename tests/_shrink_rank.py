"""One rank of a job that loses ranks and goes on (tests/test_shrink.py):

    python _shrink_rank.py RANK SIZE PORT TRANSPORT HOSTS SCENARIO

SCENARIO "die=A,B,...": the ranks listed (old numbering) kill themselves (SIGKILL), one
per round, in the middle of an all_reduce loop; the survivors of each round catch the
PeerError, check that the communicator is revoked, shrink, and check an all_reduce on
the new one. "agree": no failure; agree() with rank 1 voting False, then True, then 40
more (rank 1 voting False in every third), then a shrink of the whole, healthy world.
"shrinkdie=A,B": A dies in the loop, B while the others shrink. "bigdie=A": A dies in a
loop of 16 MiB all_reduces; the others shrink and check calls of several sizes against
numpy. "rightdies": rank 1 dies while rank 0 waits on a late rank 2. "stop=A": A stops
itself (SIGSTOP) in the loop; the others time out, shrink without it and time the shrink
(the test kills A). "resume=A:DIR": A stops itself; the others shrink without it, write
their report to DIR and keep the shrunk communicator until DIR/done exists; the test
resumes A, whose shrink must then refuse to make a communicator of it alone. Prints one
JSON line per rank at the end."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from _victims import check, check_sizes, fail_in_loop


def segments_mapped() -> int:
    """How many of ringreduce's shared-memory segments (memfds) this process maps."""
    with open("/proc/self/maps") as maps:
        return len({line.split()[4] for line in maps if "memfd:ringreduce" in line})


def loop_until_failure(comm, old_rank: int, victim: int, elems: int = 1 << 15) -> dict:
    """all_reduce until a peer dies (this rank dies itself if it is the victim)."""
    exc = fail_in_loop(comm, old_rank, victim, elems=elems)
    if exc is None:
        return {"peer": None}
    if not isinstance(exc, rr.PeerError):
        raise exc
    seen = {"peer": exc.peer, "failed": sorted(exc.failed), "revoked": comm.revoked}
    try:
        comm.all_reduce(np.ones(1 << 15, dtype=np.float32))  # a rank that keeps calling
        seen["again"] = "ran"
    except rr.PeerError as again:
        seen["again"] = sorted(again.failed)
    return seen


def stop_or_time_out(comm, old_rank: int, victim: int) -> dict:
    """all_reduce until the loop fails on a stopped peer (this rank stops itself if it is
    the victim, and fails once the test resumes it, if ever)."""
    exc = fail_in_loop(comm, old_rank, victim, signal.SIGSTOP)
    if exc is None:
        return {"error": None}
    return {"error": type(exc).__name__, "revoked": comm.revoked}


def die_once_agreed() -> None:
    """This rank dies inside its next shrink, once the agreement has counted it in: the
    others then make a communicator with it. (A timer would often fire after the shrink,
    which takes milliseconds: a later failure, not one during the shrink.)"""
    from ringreduce._comm.membership import agreement as membership

    agree = membership.Membership.agree

    def agree_then_die(self, *args, **kwargs):
        agree(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    membership.Membership.agree = agree_then_die


def main() -> None:
    rank, size, port, transport, hosts, scenario = sys.argv[1:7]
    rank, size, hosts = int(rank), int(size), int(hosts)
    if hosts:
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank * hosts // size}"
    # shrinkdie: the survivors wait out the timeout for the second victim; stop: for the
    # first one.
    timeout = {"shrinkdie": 4, "stop": 2, "resume": 2}.get(scenario.split("=")[0], 20)
    comm = rr.init(
        transport,
        rank=rank,
        world_size=size,
        master_addr="127.0.0.1",
        master_port=int(port),
        timeout=timeout,
    )
    report = {"rank": rank, "rounds": []}
    if scenario == "agree":
        report["votes"] = [comm.agree(rank != 1), comm.agree(True)]
        # Agreement after agreement (a program committing every step): the host's store
        # keeps only the last rounds' decisions. Counted before a barrier, so that no
        # rank checks in for the next round meanwhile.
        server = comm._membership.server
        keys = [server.key_count()]
        comm.barrier()
        report["many"] = [comm.agree(rank != 1 or k % 3 != 0) for k in range(40)]
        keys.append(server.key_count())
        comm.barrier()
        report["keys"] = keys
        new = comm.shrink()
        report["rounds"].append({"new_rank": new.rank, "size": new.world_size, "ok": check(new)})
        new.close()
    elif scenario.startswith("stop="):
        victim = int(scenario.split("=")[1])
        seen = stop_or_time_out(comm, rank, victim)
        start = time.monotonic()
        # Waiting for the stopped rank would take min(2, 8 / 4) = 2 s to give up on it as
        # the agreement's host, and 1.25 x that for a suspected rank to check in.
        new = comm.shrink(timeout=8)
        seen["shrink_s"] = time.monotonic() - start
        seen.update(new_rank=new.rank, size=new.world_size, ok=check(new))
        seen["failed_ranks"] = sorted(comm.failed_ranks)
        report["rounds"].append(seen)
        new.close()
    elif scenario.startswith("resume="):
        victim, where = scenario.split("=")[1].split(":", 1)
        seen = stop_or_time_out(comm, rank, int(victim))
        try:
            new = comm.shrink(timeout=5)
        except rr.PeerError as exc:
            seen["left_out"] = str(exc)
        else:
            seen.update(new_rank=new.rank, size=new.world_size, ok=check(new))
            if rank != int(victim):
                comm.close()  # the old one: its standby stores go, but for the host's
                with open(os.path.join(where, f"rank{rank}.json"), "w") as f:
                    json.dump(seen, f)
                start = time.monotonic()
                while not os.path.exists(os.path.join(where, "done")):
                    if time.monotonic() - start > 60:
                        break
                    time.sleep(0.05)
            new.close()
        report["rounds"].append(seen)
    elif scenario == "rightdies":
        # Rank 0 waits on rank 2, which comes 6 s late, when its right neighbour (1) dies:
        # rank 0 must learn at once, not when it next sends to rank 1.
        x = np.ones(1 << 20, dtype=np.float32)
        if rank == 1:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
        if rank == 2:
            time.sleep(6)
        start = time.monotonic()
        try:
            comm.all_reduce(x)
            seen = {"peer": None}
        except rr.RingReduceError as exc:
            seen = {"peer": getattr(exc, "peer", None), "kind": type(exc).__name__}
        seen["after_s"] = time.monotonic() - start
        report["rounds"].append(seen)
    elif scenario.startswith("bigdie="):
        # 16 MiB calls: the victim dies with megabytes in flight on every link, which
        # the links taken over must drop before the first call of the shrunk one.
        seen = loop_until_failure(comm, rank, int(scenario.split("=")[1]), elems=1 << 22)
        new = comm.shrink()
        stats = new.stats()
        seen["links"] = [stats["tcp_links_reused"], stats["tcp_links_connected"]]
        seen["shm_kept"] = stats["shm_peers_reused"]
        seen.update(new_rank=new.rank, size=new.world_size, ok=check_sizes(new))
        report["rounds"].append(seen)
        new.close()
    elif scenario.startswith("shrinkdie="):
        first, second = (int(v) for v in scenario.split("=")[1].split(","))
        seen = loop_until_failure(comm, rank, first)
        if rank == second:  # dies while the others shrink: counted in, then gone
            die_once_agreed()
        new = comm.shrink()
        seen.update(new_rank=new.rank, size=new.world_size, ok=check(new))
        seen["failed_ranks"] = sorted(comm.failed_ranks)
        report["rounds"].append(seen)
        new.close()
    else:
        olds = list(range(size))  # old rank of each rank of the current communicator
        for victim in [int(v) for v in scenario.split("=")[1].split(",")]:
            seen = loop_until_failure(comm, rank, victim)
            mapped = segments_mapped()
            start = time.monotonic()
            new = comm.shrink()
            seen["shrink_s"] = time.monotonic() - start
            seen["segments"] = [mapped, segments_mapped()]
            seen["failed_ranks"] = sorted(comm.failed_ranks)
            olds = [o for i, o in enumerate(olds) if i not in comm.failed_ranks]
            seen.update(new_rank=new.rank, size=new.world_size, old_of_new=olds[new.rank])
            stats = new.stats()
            seen["links"] = [stats["tcp_links_reused"], stats["tcp_links_connected"]]
            seen["shm_kept"] = stats["shm_peers_reused"]
            seen["ok"] = check(new)
            comm.close()
            comm = new
            report["rounds"].append(seen)
    comm.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    import numpy as np

    import ringreduce as rr

    main()
