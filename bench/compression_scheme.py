"""Which scheme a compressed all_reduce should run, measured (issue 22: "decode, add in
fp32 and re-encode at each hop, or a one-hop reduce-scatter over the full mesh followed
by an all-gather: choose by measurement").

    python bench/compression_scheme.py --link 1gbit -n 4     # 4 emulated hosts (root)
    python bench/compression_scheme.py --link shm -n 4

Both schemes share their second half: every owner encodes its chunk's float32 sum once,
one all_gather brings every payload to every rank, and every rank decodes them all. They
differ in how the owner gets its sum:

- *one-hop* (ringreduce's, ``comm.all_reduce(x, compression=codec)``): every rank encodes
  the chunks it does not own once, one all_to_all sends chunk k to rank k, and the owner
  decodes the N-1 payloads and adds them in float32 to its own, unencoded chunk. Each
  contribution is quantized once. It runs whole (``pieces="never"``) and as it runs by
  default (in pieces where that pays).
- *ring*: N-1 hops; at each, a rank encodes the float32 partial sum it holds, sends it
  to the next rank and receives the previous rank's, which it decodes and adds in
  float32 to its own contribution. Each partial sum is quantized again at every hop. It
  is written here with the same codec kernels (encode, decode_add) and the engine's
  point-to-point messages (the send overlapped with the receive), whole, as the one-hop
  row "whole" is: not segmented, so that no hop's codec work overlaps its transfer.

Reported: the slowest rank's best of ``--reps`` calls after one warm-up, and the
relative L2 error of the result against the float64 sum of the same inputs (Gaussian,
a different seed per rank), which rank 0 regenerates. Error feedback has no place in
the ring: the errors made at its middle hops belong to no rank's input.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compression as compression_bench  # noqa: E402  (bench/compression.py)

NS, SWITCH, SUBNET = "rrsch", "rrschsw", "10.234.0"


def inputs(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(n, dtype=np.float32)


def ring_all_reduce(comm, codec, x: np.ndarray, call: int) -> np.ndarray:
    """The per-hop scheme: a reduce-scatter ring that re-encodes every partial sum, then
    the one-hop scheme's all_gather of the owners' encoded sums."""
    import ringreduce as rr

    n, size, rank = x.size, comm.world_size, comm.rank
    bounds = [rr.chunk_bounds(n, size, k) for k in range(size)]
    acc = x.copy()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        lo, hi = bounds[(rank - step) % size]
        payload = codec.encode(acc[lo:hi], seed=(call * 64 + rank) * 64 + step)
        sent = comm.send(payload, nxt, async_op=True)
        lo, hi = bounds[(rank - step - 1) % size]
        got = np.empty(codec.payload_bytes(hi - lo), np.uint8)
        comm.recv(got, prv)
        sent.wait()
        codec.decode_add([got], hi - lo, acc[lo:hi])  # own contribution + the partial sum
    lo, hi = bounds[(rank + 1) % size]  # the chunk this rank now holds whole
    width = max(codec.payload_bytes(b - a) for a, b in bounds)
    row = np.zeros(width, np.uint8)
    row[: codec.payload_bytes(hi - lo)] = codec.encode(acc[lo:hi], seed=call * 64 + 63)
    rows = comm.all_gather(row).reshape(size, width)
    out = np.empty(n, np.float32)
    for k in range(size):
        lo, hi = bounds[(k + 1) % size]  # rank k owns chunk k + 1
        out[lo:hi] = codec.decode(rows[k], hi - lo)
    return out


def one_hop(comm, x: np.ndarray, name: str, call: int) -> np.ndarray:
    return comm.all_reduce(x, compression=name)


def timed(comm, run, reps: int):
    """(the slowest rank's best seconds of ``reps`` calls after one warm-up, the result)."""
    best, y = float("inf"), None
    for i in range(reps + 1):
        comm.barrier()
        t0 = time.perf_counter()
        y = run(i)
        dt = float(comm.all_reduce(np.array([time.perf_counter() - t0]), "max")[0])
        if i:  # the first call warms up
            best = min(best, dt)
    return best, y


def rank_main(opts: dict) -> None:
    import ringreduce as rr
    from ringreduce.compression import configure, get_codec

    comm = rr.init("tcp" if opts["link"] != "shm" else "shm", timeout=600)
    size, rank = comm.world_size, comm.rank
    rows = []
    for n in (compression_bench.parse_size(s) // 4 for s in opts["sizes"].split(",")):
        x = inputs(rank, n)
        exact = sum(inputs(r, n).astype(np.float64) for r in range(size)) if rank == 0 else None
        for name in opts["codecs"].split(","):
            codec = get_codec(name)
            for scheme, pieces in (
                ("one-hop, whole", "never"),
                ("one-hop", "auto"),
                ("ring, re-encoded per hop", "never"),
            ):
                configure(pieces=pieces)
                if scheme.startswith("ring"):
                    run = functools.partial(ring_all_reduce, comm, codec, x)
                else:
                    run = functools.partial(one_hop, comm, x, name)
                best, y = timed(comm, run, opts["reps"])
                digest = hashlib.sha256(y.tobytes()).digest()[:8]
                same = comm.all_gather(np.frombuffer(digest, np.int64).copy()).reshape(-1)
                if rank == 0:
                    err = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
                    rows.append(
                        {
                            "bytes": n * 4,
                            "codec": name,
                            "scheme": scheme,
                            "seconds": best,
                            "error": err,
                            "identical": bool(len(set(same.tolist())) == 1),
                        }
                    )
        configure(pieces="auto")
    if rank == 0:
        print(json.dumps(rows))
    comm.close()


def launch(args: argparse.Namespace) -> list:
    argv = [os.path.abspath(__file__), "--rank-main", json.dumps(vars(args))]
    return compression_bench.run_ranks(
        args, argv, NS, SWITCH, SUBNET, "s", env={"OMP_NUM_THREADS": "1"}
    )


def table(rows: list, args: argparse.Namespace) -> str:
    out = [
        f"compressed all_reduce, two schemes: {args.link}, {args.n} ranks; the slowest "
        f"rank's best of {args.reps}; error: relative L2 against the float64 sum",
        "",
        "| size | codec | scheme | ms | x one-hop, whole | relative error | ranks identical |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    base = {(r["bytes"], r["codec"]): r["seconds"] for r in rows if r["scheme"] == "one-hop, whole"}
    for r in rows:
        size = compression_bench.human(r["bytes"])
        ratio = r["seconds"] / base[(r["bytes"], r["codec"])]
        same = "yes" if r["identical"] else "NO"
        out.append(
            f"| {size} | {r['codec']} | {r['scheme']} | {r['seconds'] * 1e3:.2f} | "
            f"{ratio:.2f} | {r['error']:.2e} | {same} |"
        )
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(json.loads(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=4, help="ranks (one per emulated host)")
    p.add_argument("--link", default="1gbit", help="shm, or a tc rate: 1gbit, 10gbit")
    p.add_argument("--sizes", default="1M,16M,64M")
    p.add_argument("--codecs", default="bf16,int8,int4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--burst", default="256K", help="tc tbf's burst on every shaped link")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = launch(args)
    print(table(rows, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f)


if __name__ == "__main__":
    main()
