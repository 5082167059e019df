"""Runs PyTorch's DistributedTest suite (dist_suite.py) on ringreduce and on Gloo, or reads
earlier runs, and compares the outcomes test by test.

    python tests/torch_suite/compare.py --world-size 2            # runs both (long: ~1 h each)
    python tests/torch_suite/compare.py --ours rr2.xml --gloo gloo2.xml   # compares saved runs

Prints passed/skipped/failed for each backend and every test that passes on Gloo but not
on ringreduce (the list that must stay empty, apart from documented differences), and
every test that passes only on ringreduce. Exits 1 when the first list is not empty.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def outcomes(junit_xml: str) -> dict:
    """{test name: "passed" | "skipped" | "failed"} from a pytest --junitxml file."""
    result = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        elif case.find("skipped") is not None:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def run_suite(backend: str, world_size: int, junit_xml: str, extra: list) -> None:
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        os.path.join(HERE, "dist_suite.py"),
        "-q",
        "-o",
        "addopts=",
        "-o",
        "filterwarnings=default",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit_xml}",
        *extra,
    ]
    subprocess.run(cmd, env=env, check=False)


def counts(result: dict) -> str:
    values = list(result.values())
    return ", ".join(f"{values.count(k)} {k}" for k in ("passed", "skipped", "failed"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ours", help="junit xml of a ringreduce run (else run it)")
    parser.add_argument("--gloo", help="junit xml of a Gloo run (else run it)")
    parser.add_argument("-k", default=None, help="pytest -k expression for both runs")
    args = parser.parse_args()
    extra = ["-k", args.k] if args.k else []
    files = {}
    for backend, given in (("ringreduce", args.ours), ("gloo", args.gloo)):
        if given is None:
            given = f"{backend}{args.world_size}.xml"
            run_suite(backend, args.world_size, given, extra)
        files[backend] = outcomes(given)
    ours, gloo = files["ringreduce"], files["gloo"]
    print(f"world size {args.world_size}")
    print(f"  ringreduce: {counts(ours)}")
    print(f"  gloo:       {counts(gloo)}")
    behind = sorted(t for t, o in gloo.items() if o == "passed" and ours.get(t) != "passed")
    ahead = sorted(t for t, o in ours.items() if o == "passed" and gloo.get(t) != "passed")
    print(f"passed on Gloo, not on ringreduce ({len(behind)}):")
    for t in behind:
        print(f"  {t}: {ours.get(t, 'not run')}")
    print(f"passed on ringreduce, not on Gloo ({len(ahead)}):")
    for t in ahead:
        print(f"  {t}: gloo {gloo.get(t, 'not run')}")
    return 1 if behind else 0


if __name__ == "__main__":
    sys.exit(main())
