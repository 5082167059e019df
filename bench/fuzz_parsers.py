"""The wire parsers' fuzzer, for longer than the tests run it.

    python bench/fuzz_parsers.py --frames 1000000 --seeds 4

Feeds every parser that reads bytes another process controls (the store's requests,
replies and handshake, the TCP link hello, the call header, the failure reports) random
and mutated frames (ringreduce._core.testing.fuzz_parsers) and prints, per parser, how
many were accepted, rejected and left incomplete, and how many broke the parser's
contract (must be 0). Run it under .ci/sanitizers.sh's build to have ASan and UBSan
watch: ``LD_PRELOAD=... PYTHONPATH=<that build> python bench/fuzz_parsers.py``.
"""

from __future__ import annotations

import argparse
import sys
import time

from ringreduce import _core


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=200_000, help="frames per parser per seed")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--seed", type=int, default=1, help="first seed")
    args = p.parse_args()
    totals: dict = {}
    start = time.monotonic()
    for seed in range(args.seed, args.seed + args.seeds):
        for name, counts in _core.testing.fuzz_parsers(args.frames, seed).items():
            zero = {"frames": 0, "accepted": 0, "rejected": 0, "incomplete": 0, "violations": 0}
            t = totals.setdefault(name, dict(zero, first=""))
            for key in ("frames", "accepted", "rejected", "incomplete", "violations"):
                t[key] += counts[key]
            t["first"] = t["first"] or counts["first_violation"]
    seconds = time.monotonic() - start
    print(
        f"{'parser':<16} {'frames':>10} {'accepted':>10} {'rejected':>10} "
        f"{'incomplete':>10} {'violations':>10}"
    )
    for name, t in sorted(totals.items()):
        print(
            f"{name:<16} {t['frames']:>10} {t['accepted']:>10} {t['rejected']:>10} "
            f"{t['incomplete']:>10} {t['violations']:>10}  {t['first']}"
        )
    print(f"{sum(t['frames'] for t in totals.values())} frames in {seconds:.1f} s")
    return 1 if any(t["violations"] for t in totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
