"""The ``ringreduce`` command: ``launch``, ``bench``, ``model`` and ``info`` subcommands."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

__all__ = ["main"]

_USAGE = """\
usage: ringreduce <command> [options]
       ringreduce --version

commands:
  launch   run a program as N ranks:  ringreduce launch -n 4 -- python train.py
  bench    all_reduce benchmark (nccl-tests style table):  ringreduce bench -n 4
  model    cost model: predicted collective times, algorithm choice, a step's communication
           share:  ringreduce model --params 7e9 --dtype float16 --ranks 8 --link-gbps 800
  info     what this build contains (version, transports, CUDA, CPU kernels) as JSON

'ringreduce <command> -h' describes a command's options.
"""


def _info(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(
            "usage: ringreduce info\n\nPrints ringreduce.build_info() as JSON: version, "
            "transports built in, whether MPI and CUDA are, which CPU kernels run, and how "
            "many CUDA devices are usable."
        )
        return 0
    if argv:
        print(f"ringreduce info: unexpected arguments {argv}", file=sys.stderr)
        return 2
    import ringreduce

    info = dict(ringreduce.build_info())
    info["cuda_devices"] = ringreduce._core.cuda_device_count()
    print(json.dumps(info, indent=2, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``ringreduce <command> ...``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0 if args else 2
    if args[0] in ("--version", "-V", "version"):
        import ringreduce

        print(f"ringreduce {ringreduce.__version__}")
        return 0
    command, rest = args[0], args[1:]
    # Each subcommand parses its own arguments: launch must leave everything after
    # "--" untouched, which a shared argparse tree would not.
    if command == "launch":
        from .launch import main as launch_main

        return launch_main(rest, prog="ringreduce launch")
    if command == "bench":
        from .bench import main as bench_main

        return bench_main(rest, prog="ringreduce bench")
    if command == "model":
        from .model.cli import main as model_main

        return model_main(rest, prog="ringreduce model")
    if command == "info":
        return _info(rest)
    print(f"ringreduce: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
