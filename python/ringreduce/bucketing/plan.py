"""The bucket plan of a GradientBucketer and the cross-rank check that every rank shares it.

A *plan* assigns each registered parameter to a bucket. Backward produces the gradients of
the last layers first, so the plan walks the registration order backwards: bucket 0 holds
the last-registered parameters and is the first to fill. Every rank must build the same
plan, or the per-bucket all-reduces would pair buffers of different parameters (or of
different sizes) across ranks; `check_plan` proves they agree before anything is reduced.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays.bfloat16 import bfloat16

__all__ = [
    "MIB",
    "ParamSpec",
    "as_dtype",
    "check_plan",
    "describe_plan",
    "first_difference",
    "is_floating",
    "make_spec",
    "plan_buckets",
]

MIB = 1 << 20
"""Bucket caps are in MiB, like PyTorch DDP's ``bucket_cap_mb``."""


@dataclass(frozen=True)
class ParamSpec:
    """One registered parameter: its name, shape and gradient dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def numel(self) -> int:
        """Number of elements of the gradient."""
        return math.prod(self.shape)


def as_dtype(dtype: Any) -> np.dtype:
    """Turns a numpy dtype, a dtype name ("bfloat16" too) or a torch dtype into a numpy dtype.

    bfloat16 maps to ``ml_dtypes.bfloat16``; ml_dtypes is imported only when asked for.
    """
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    # Torch dtypes print as "torch.float32"; strings like "bf16" are common shorthands.
    name = str(dtype).removeprefix("torch.")
    name = {
        "bf16": "bfloat16",
        "fp16": "float16",
        "fp32": "float32",
        "half": "float16",
        "float": "float32",
        "double": "float64",
    }.get(name, name)
    if name == "bfloat16":
        return bfloat16("a bfloat16 gradient")
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"unsupported gradient dtype {dtype!r}") from None


def make_spec(
    name: Any, shape: Sequence[int], dtype: Any, taken: set, *, floating_only: bool
) -> ParamSpec:
    """A checked registration: a new str name, non-negative dimensions, a known dtype
    (floating when ``floating_only``)."""
    if not isinstance(name, str):
        raise TypeError(f"parameter name must be a str, got {type(name).__name__}")
    if name in taken:
        raise ValueError(f"parameter {name!r} registered twice")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"parameter {name!r}: negative dimension in shape {dims}")
    np_dtype = as_dtype(dtype)
    if floating_only and not is_floating(np_dtype):
        raise TypeError(
            f"parameter {name!r}: average=True needs a floating-point gradient, got {np_dtype}"
        )
    return ParamSpec(name, dims, np_dtype)


def is_floating(dtype: np.dtype) -> bool:
    """True for float16/32/64 and the ml_dtypes floats (bfloat16), which numpy calls 'V'."""
    return dtype.kind == "f" or dtype.name.startswith(("bfloat", "float"))


def plan_buckets(
    sizes: Sequence[int],
    wire_dtypes: Sequence[np.dtype],
    first_bucket_bytes: float,
    bucket_bytes: float,
) -> list[list[int]]:
    """Groups registered parameters into buckets, in the order backward fills them.

    ``sizes[i]`` is parameter i's size in bytes on the wire. The walk goes from the last
    registered parameter to the first; a bucket is closed when the next parameter would push
    it past its cap (``first_bucket_bytes`` for bucket 0, ``bucket_bytes`` after) or has a
    different wire dtype, because one all-reduce carries one dtype. A parameter larger than
    the cap never shares a bucket. Returns, per bucket, the parameter indices in fill order.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i in reversed(range(len(sizes))):
        cap = first_bucket_bytes if not buckets else bucket_bytes
        if current and (
            current_bytes + sizes[i] > cap or wire_dtypes[i] != wire_dtypes[current[0]]
        ):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += sizes[i]
    if current:
        buckets.append(current)
    return buckets


def describe_plan(specs: Sequence[ParamSpec], settings: dict) -> list[str]:
    """The canonical per-rank description that `check_plan` compares: one line per entry.

    Entry 0 holds the bucketer's settings (they change the plan too); entry i + 1 is
    registered parameter i. JSON escapes newlines, so joining the lines is unambiguous.
    """
    lines = [json.dumps(["<settings>", settings], sort_keys=True)]
    lines += [json.dumps([s.name, list(s.shape), s.dtype.name]) for s in specs]
    return lines


def check_plan(comm: Any, lines: list[str], mismatch_error: type) -> None:
    """Raises ``mismatch_error`` on every rank unless all ranks passed the same ``lines``.

    Costs one all-gather of a 32-byte digest when the plans agree. When they differ, every
    rank gathers every rank's full description, so all of them find (and name) the same first
    difference and raise together: no rank is left waiting in a later collective.
    """
    blob = "\n".join(lines).encode()
    digest = np.frombuffer(hashlib.sha256(blob).digest(), dtype=np.uint8).copy()
    digests = np.asarray(comm.all_gather(digest)).reshape(comm.world_size, -1)
    if (digests == digests[0]).all():
        return
    lengths = np.asarray(comm.all_gather(np.array([len(blob)], dtype=np.int64))).reshape(-1)
    padded = np.zeros(int(lengths.max()), dtype=np.uint8)
    padded[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    blobs = np.asarray(comm.all_gather(padded)).reshape(comm.world_size, -1)
    per_rank = [bytes(blobs[r, : lengths[r]]).decode().split("\n") for r in range(len(lengths))]
    raise mismatch_error(first_difference(per_rank))


def first_difference(per_rank: Sequence[Sequence[str]]) -> str:
    """Names the first entry where the ranks' plan descriptions differ, and which ranks hold
    each variant; the text of the MismatchError."""
    longest = max(len(lines) for lines in per_rank)
    for i in range(longest):
        variants: dict[str | None, list[int]] = {}
        for rank, lines in enumerate(per_rank):
            variants.setdefault(lines[i] if i < len(lines) else None, []).append(rank)
        if len(variants) == 1:
            continue
        parts = [
            f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}: {_entry(line)}"
            for line, ranks in variants.items()
        ]
        if i == 0:
            return "GradientBucketer settings differ across ranks: " + "; ".join(parts)
        names = sorted({json.loads(line)[0] for line in variants if line is not None})
        return (
            f"GradientBucketer plan differs across ranks at parameter #{i - 1} "
            f"({', '.join(repr(n) for n in names)}): " + "; ".join(parts)
        )
    return "GradientBucketer plan digests differ across ranks but the plans read the same"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _entry(line: str | None) -> str:
    if line is None:
        return "no parameter (fewer registered)"
    name, *rest = json.loads(line)
    if name == "<settings>":
        return json.dumps(rest[0], sort_keys=True)
    shape, dtype = rest
    return f"{name!r} shape {tuple(shape)} dtype {dtype}"
