"""Two builds of ringreduce side by side: `ringreduce bench` of each, interleaved.

Each round runs the benchmark once per build and size, alternating the builds,
so that both see the same machine state; the table shows the median time per
size over the rounds and the ratio B/A (below 1: B is faster).

    pip install --no-deps --target /tmp/rr_a dist/ringreduce-OLD.whl
    python bench/ab_compare.py --a /tmp/rr_a --b "" -n 2 --sizes 8,1M,64M --rounds 5

--a/--b are directories put first on PYTHONPATH ("" means the installed
package). Extra arguments after -- go to `ringreduce bench` (e.g. --transport).

An editable install (``pip install -e .``) puts an import hook ahead of PYTHONPATH,
which would run the editable tree instead of the build under test. Each run therefore
starts with a ``sitecustomize`` that drops any import hook sending ``ringreduce``
outside the build's directory, and each build is checked once, before the rounds, to
import from where it was given (a clear error otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# Run at interpreter start (as sitecustomize): drops import hooks that would take
# ringreduce from anywhere but RR_AB_SITE, such as an editable install's.
_SITECUSTOMIZE = """
import os, sys
site = os.environ.get("RR_AB_SITE")
if site:
    def _elsewhere(finder):
        if type(finder).__module__ == "_frozen_importlib_external":
            return False  # the path finder: sys.path, with the site first
        try:
            spec = finder.find_spec("ringreduce", None)
        except Exception:
            return False
        origin = getattr(spec, "origin", None) if spec is not None else None
        return bool(origin) and not os.path.abspath(origin).startswith(site)
    sys.meta_path[:] = [f for f in sys.meta_path if not _elsewhere(f)]
"""


def _env(site: str, hooks: str) -> dict:
    env = dict(os.environ)
    if site:
        site = os.path.abspath(site)
        env["RR_AB_SITE"] = site
        env["PYTHONPATH"] = os.pathsep.join([hooks, site, env.get("PYTHONPATH", "")])
    return env


def _check(name: str, site: str, hooks: str) -> None:
    """Fails unless build ``name`` imports ringreduce from ``site``."""
    if not site:
        return
    got = subprocess.run(
        [sys.executable, "-c", "import ringreduce; print(ringreduce.__file__)"],
        env=_env(site, hooks),
        cwd=hooks,
        capture_output=True,
        text=True,
        timeout=120,
    )
    where = got.stdout.strip()
    if got.returncode != 0 or not os.path.abspath(where).startswith(os.path.abspath(site)):
        raise SystemExit(
            f"build {name}: ringreduce imports from {where or '(nothing)'} "
            f"instead of {site}: {got.stderr.strip()[-300:]}"
        )


def _run(site: str, ranks: int, size: int, extra: list, hooks: str) -> dict:
    """Median-free single run: {placement: time_us} for one size."""
    env = _env(site, hooks)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "ringreduce", "bench", "-n", str(ranks), "-b", str(size)]
        cmd += ["-e", str(size), "--json", path, *extra]
        # The bench runs from an empty directory, so a source tree in the current
        # directory cannot shadow the build under test.
        subprocess.run(cmd, env=env, cwd=tmp, check=True, capture_output=True, timeout=600)
        with open(path) as f:
            rows = json.load(f)["rows"]
    return {row["placement"]: row["time_us"] for row in rows if row["system"] == "ringreduce"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="site directory of build A ('' = installed)")
    parser.add_argument("--b", required=True, help="site directory of build B ('' = installed)")
    parser.add_argument("-n", "--ranks", type=int, default=2)
    parser.add_argument("--sizes", default="8,1M,64M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="arguments for ringreduce bench, after --")
    args = parser.parse_args()
    sizes = [_bytes(s) for s in args.sizes.split(",")]
    hooks = tempfile.mkdtemp(prefix="rr_ab_")
    with open(os.path.join(hooks, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    _check("A", args.a, hooks)
    _check("B", args.b, hooks)
    times: dict = {}
    for r in range(args.rounds):
        for size in sizes:
            # Alternate which build goes first, so neither always runs on a warmer machine.
            order = [("A", args.a), ("B", args.b)]
            if r % 2:
                order.reverse()
            for name, site in order:
                for placement, t in _run(site, args.ranks, size, args.extra, hooks).items():
                    times.setdefault((size, placement, name), []).append(t)
        print(f"# round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"# {args.ranks} ranks, median of {args.rounds} interleaved runs; time in us")
    print(f"{'size':>10} {'placement':>13} {'A':>10} {'B':>10} {'B/A':>6}")
    for size in sizes:
        for placement in ("out-of-place", "in-place"):
            a = statistics.median(times[(size, placement, "A")])
            b = statistics.median(times[(size, placement, "B")])
            print(f"{size:>10} {placement:>13} {a:>10.1f} {b:>10.1f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
