"""One rank that loops an all_reduce until something stops it, and says what did.

    python _signal_rank.py RANK SIZE PORT TRANSPORT HOSTS TIMEOUT MB [MODE]

(under mpirun: RANK and SIZE are -1 and come from the launcher, TRANSPORT is "mpi").
Prints "ready RANK PID" once the communicator is made and its first call done, then
"end RANK WHAT" for how the loop ended: WHAT is "interrupted", "peer P ..." (PeerError,
P its .peer), "timeout P ..." (TimeoutError) or "error ..." (anything else). MODE: "sync" (blocking
all_reduce, the default), "async" (Work.wait()), "p2p" (a recv from the next rank),
"init" (rank 0 says ready before init: it waits there for ranks never started).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

faulthandler.enable()
# Ctrl-C as a program started from a shell has it: a process inherits its parent's
# ignored and blocked signals, and the test process's may have been changed by what
# ran in it before (a library that ignores or blocks SIGINT in its threads).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main() -> None:
    rank, size, port, transport, hosts, timeout, mb = sys.argv[1:8]
    rank, size, hosts = int(rank), int(size), int(hosts)
    if hosts and rank >= 0:
        os.environ["RINGREDUCE_HOST_ID"] = f"emulated-host-{rank * hosts // size}"
    import numpy as np

    import ringreduce as rr

    mode = sys.argv[8] if len(sys.argv) > 8 else "sync"
    try:
        if mode == "init" and rank == 0:
            print(f"ready {rank} {os.getpid()}", flush=True)  # waits for ranks never started
        if transport == "mpi":
            comm = rr.init("mpi", timeout=float(timeout))
        else:
            comm = rr.init(
                transport,
                rank=rank,
                world_size=size,
                master_addr="127.0.0.1",
                master_port=int(port),
                timeout=float(timeout),
            )
    except KeyboardInterrupt:
        print(f"end {rank} interrupted", flush=True)
        os._exit(0)
    x = np.ones(int(float(mb) * (1 << 20)) // 4, dtype=np.float32)
    out = np.empty_like(x)
    comm.all_reduce(x, out=out)
    print(f"ready {comm.rank} {os.getpid()}", flush=True)
    try:
        while True:
            if mode == "p2p":
                comm.recv(out, src=(comm.rank + 1) % comm.world_size)
            elif mode == "async":
                comm.all_reduce(x, out=out, async_op=True).wait()
            else:
                comm.all_reduce(x, out=out)
    except KeyboardInterrupt:
        print(f"end {comm.rank} interrupted", flush=True)
    except rr.PeerError as e:
        print(f"end {comm.rank} peer {e.peer} {e}".replace("\n", " "), flush=True)
    except rr.TimeoutError as e:
        print(f"end {comm.rank} timeout {e.peer} {e}".replace("\n", " "), flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"end {comm.rank} error {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    # Exit without closing: the peers must learn from what the engine did at the failure.
    # Not at once: under mpirun the first rank to exit takes the others with it.
    time.sleep(5)
    os._exit(0)


if __name__ == "__main__":
    main()
