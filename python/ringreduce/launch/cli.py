"""``ringreduce launch``'s command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .run import launch

__all__ = ["build_parser", "main"]


_EPILOG = """\
examples:
  ringreduce launch -n 4 -- python train.py --lr 0.1
  ringreduce launch --nproc-per-node 4 -- train.py       (torchrun's spelling; .py runs with
                                                          this interpreter)
  on 2 machines, node 0 at 10.0.0.1:
    ringreduce launch --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29500 -- python train.py
    ringreduce launch --nnodes 2 --node-rank 1 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29500 -- python train.py

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
and RINGREDUCE_PORT = MASTER_PORT + 1 (torch.distributed's env:// store listens on
MASTER_PORT, ringreduce's rendezvous on RINGREDUCE_PORT, so both work in one job).
"""


def build_parser(prog: str = "ringreduce launch") -> argparse.ArgumentParser:
    """The argument parser of ``ringreduce launch``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a program as N ranks with RANK/WORLD_SIZE/MASTER_* set.",
        usage=f"{prog} -n N [options] -- prog [args...]",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n",
        "--nprocs",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nprocs",
        type=int,
        required=True,
        help="ranks on this machine",
    )
    p.add_argument(
        "--nnodes", type=int, default=1, help="machines in the job (default: %(default)s)"
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="this machine's index, 0..nnodes-1 (default: %(default)s)",
    )
    p.add_argument("--transport", help="exported as RINGREDUCE_TRANSPORT (auto, shm, tcp, mpi)")
    p.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        help="node 0's address (needed with --nnodes > 1; default: 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        help="default: a free port (needed with --nnodes > 1)",
    )
    p.add_argument(
        "--no-prefix", action="store_true", help="do not prefix output lines with [rank]"
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds from SIGTERM to SIGKILL when stopping ranks (default: %(default)s)",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="a rank that fails does not stop the others (for jobs that survive a dead rank "
        "with Communicator.shrink); the job succeeds when every rank not killed by a signal "
        "exits 0",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "ringreduce launch") -> int:
    """Entry point of ``ringreduce launch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    # Everything after the first "--" belongs to the program, even if it looks like ours.
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        args.cmd = argv[cut + 1 :]
    else:
        args = parser.parse_args(argv)
    if not args.cmd:
        parser.error("no program given (put it after --)")
    if args.nprocs < 1:
        parser.error("-n must be at least 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        parser.error("need --nnodes >= 1 and 0 <= --node-rank < --nnodes")
    if args.nnodes > 1 and args.master_port is None:
        parser.error("with --nnodes > 1, give every node the same --master-port")
    if args.nnodes > 1 and not args.master_addr:
        parser.error("with --nnodes > 1, give every node node 0's address: --master-addr")
    return launch(
        args.nprocs,
        args.cmd,
        prefix=not args.no_prefix,
        master_addr=args.master_addr,
        master_port=args.master_port,
        transport=args.transport,
        grace=args.grace,
        keep_going=args.keep_going,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
    )


if __name__ == "__main__":
    sys.exit(main())
