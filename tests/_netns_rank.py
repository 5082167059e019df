"""One rank of the multi-host tests, run inside a network namespace.

Prints one JSON line: {"ok": bool, ...} or {"error": class name, "peer": rank, "message": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import ringreduce as rr


def main() -> None:
    mode = sys.argv[1]
    transport = os.environ.get("RR_TEST_TRANSPORT", "tcp")
    comm = rr.init(transport, timeout=float(os.environ.get("RR_TEST_TIMEOUT", "20")))
    n, r = comm.world_size, comm.rank
    out: dict = {"rank": r, "transport": comm.transport, "local": comm.local_world_size}
    try:
        if mode == "reduce":
            x = np.full(3_000_017, r + 1, dtype=np.float32)
            comm.all_reduce(x, out=x)
            out["ok"] = bool(np.all(x == n * (n + 1) / 2))
            out["stats"] = comm.stats()
        elif mode in ("partition", "split"):
            # Ready, then keep reducing while the test cuts one host's link.
            comm.barrier()
            print(json.dumps({"ready": True}), flush=True)
            x = np.ones(1 << 16, dtype=np.float32)
            start = time.monotonic()
            while time.monotonic() - start < 120:
                comm.all_reduce(x, out=x)
                x[:] = 1
            out["ok"] = False
    except rr.RingReduceError as exc:
        out.update(error=type(exc).__name__, peer=exc.peer, message=str(exc))
        out["reason"] = getattr(exc, "reason", None)
        if mode == "split":
            # Every side of the partition tries to go on: at most one may.
            began = time.monotonic()
            try:
                new = comm.shrink(timeout=8)
                got = new.all_reduce(np.ones(4, np.float32))
                out.update(shrunk=new.world_size, shrunk_sum=float(got[0]))
            except rr.RingReduceError as exc2:
                out.update(shrink_error=type(exc2).__name__, shrink_message=str(exc2))
            out["shrink_s"] = time.monotonic() - began
    print(json.dumps(out), flush=True)
    if "shrunk" in out:
        # The emulated hosts share one /proc: a survivor that exited would be seen gone
        # (proven dead) by the cut-off rank, as no real other machine's process would.
        # Stay up while it decides (its shrink's timeout).
        time.sleep(10)
    os._exit(0)  # don't linger in close() on a cut link


if __name__ == "__main__":
    main()
