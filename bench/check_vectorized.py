"""Reports which CPU reduction kernels the compiler vectorized.

Compiles csrc/reduce/cpu_kernels_variant.cc once per variant (baseline x86-64
and AVX2+F16C, the flags CMakeLists.txt uses), disassembles each kernel and
classifies it by the widest packed arithmetic it contains.

    python bench/check_vectorized.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"generic": [], "avx2": ["-mavx2", "-mf16c"]}
PACKED = re.compile(
    r"\s(v?p(add|sub|mull|mul|min|max|cmpgt|blendv)[a-z]*|v?(add|mul|min|max|div)p[sd]|vcvtph2ps|vblendvps)\s"
)


def kernels(obj: str, variant: str) -> dict:
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", obj],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = {}
    for body in re.split(r"\n(?=[0-9a-f]+ <)", text):
        m = re.match(r"[0-9a-f]+ <(.*)>:", body)
        if not m or not re.search(r"(reduce|divide)_loop<", m.group(1)):
            continue
        name = m.group(1).split("(")[0].replace(f"rr::{variant}::", "").replace("rr::", "")
        if "ymm" in body and PACKED.search(body):
            result[name] = "256-bit"
        elif PACKED.search(body):
            result[name] = "128-bit"
        else:
            result[name] = "scalar"
    return result


def main() -> int:
    for variant, flags in VARIANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            obj = os.path.join(tmp, "k.o")
            subprocess.run(
                [
                    "g++",
                    "-std=c++17",
                    "-O3",
                    *flags,
                    f"-DRR_KERNEL_VARIANT={variant}",
                    "-I",
                    os.path.join(ROOT, "csrc"),
                    "-c",
                    os.path.join(ROOT, "csrc/reduce/cpu_kernels_variant.cc"),
                    "-o",
                    obj,
                ],
                check=True,
            )
            found = kernels(obj, variant)
        counts: dict = {}
        for kind in found.values():
            counts[kind] = counts.get(kind, 0) + 1
        print(f"{variant}: {len(found)} kernels: {counts}")
        for name, kind in sorted(found.items()):
            if kind == "scalar":
                print(f"    scalar: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
