"""What a job waits for before its first collective: ``import ringreduce``, the
launcher's start-up, and ``rr.init()`` of N local ranks, each as a user meets it.

    python bench/startup.py                          # this interpreter, 4 ranks, 5 runs
    python bench/startup.py --python /tmp/venv/bin/python --ranks 4 --runs 5

For each interpreter given (a venv with another ringreduce or other dependencies, to
compare), in runs that alternate between interpreters so that both see the same load:

- import: ``python -X importtime -c "import ringreduce"``, the cumulative time of the
  import statement (what importtime prints last), and the whole process's wall time;
- launch: ``ringreduce launch -n N`` of a program that imports ringreduce, calls
  ``rr.init()`` and one 8-byte all_reduce: seconds from the launcher's start until the
  last rank has imported, has its communicator, has finished the collective, and until
  the launcher exits.

Each figure is printed as best / median over the runs, in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_RANK = """
import os, sys, time
t0 = float(os.environ["STARTUP_T0"])
import numpy as np
import ringreduce as rr
imported = time.time() - t0
comm = rr.init()
ready = time.time() - t0
comm.all_reduce(np.ones(2, np.float32))
first = time.time() - t0
print(f"STARTUP {imported:.6f} {ready:.6f} {first:.6f}", flush=True)
comm.close()
"""


def import_ms(python: str) -> tuple[float, float]:
    """(import statement's cumulative ms per importtime, the process's wall ms)."""
    start = time.perf_counter()
    r = subprocess.run(
        [python, "-X", "importtime", "-c", "import ringreduce"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    wall = (time.perf_counter() - start) * 1e3
    last = [line for line in r.stderr.splitlines() if line.startswith("import time:")][-1]
    return int(last.split("|")[1]) / 1e3, wall


def launch_ms(python: str, ranks: int) -> tuple[float, float, float, float]:
    """(last rank imported, last rank's init returned, last rank's first all_reduce done,
    the launcher exited), ms from the launcher's start."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    t0 = time.time()
    env["STARTUP_T0"] = repr(t0)
    r = subprocess.run(
        [python, "-m", "ringreduce", "launch", "-n", str(ranks), "--", python, "-c", _RANK],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    done = (time.time() - t0) * 1e3
    if r.returncode != 0:
        raise SystemExit(f"{python}: the launch failed:\n{r.stdout}\n{r.stderr}")
    rows = [
        line.split("STARTUP ", 1)[1].split() for line in r.stdout.splitlines() if "STARTUP" in line
    ]
    if len(rows) != ranks:
        raise SystemExit(f"{python}: {len(rows)} of {ranks} ranks reported:\n{r.stdout}")
    imported, ready, first = (max(float(row[i]) for row in rows) * 1e3 for i in range(3))
    return imported, ready, first, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        action="append",
        help="an interpreter with ringreduce installed (repeatable; default: this one)",
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    names = (
        "import (importtime)",
        "import (process)",
        "launch: imported",
        "launch: init",
        "launch: first all_reduce",
        "launch: exit",
    )
    results = {p: {n: [] for n in names} for p in pythons}
    for run in range(args.runs):
        for python in pythons if run % 2 == 0 else reversed(pythons):
            values = (*import_ms(python), *launch_ms(python, args.ranks))
            for name, value in zip(names, values):
                results[python][name].append(value)
    for python in pythons:
        print(f"# {python}: {args.ranks} ranks, {args.runs} runs, ms as best / median")
        for name in names:
            v = results[python][name]
            print(f"  {name:26s} {min(v):8.1f} / {statistics.median(v):8.1f}")


if __name__ == "__main__":
    main()
