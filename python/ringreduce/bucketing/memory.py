"""Where a GradientBucketer's buckets live, and the array work between gradients and buckets.

Buckets live where the gradients do: host memory for numpy arrays and CPU tensors, the GPU
for CUDA tensors and cupy arrays, where the collectives reduce them on the device. The
first gradient handed over decides; each later one is checked against it. The element-wise
work (copy in, divide for averaging, accumulate under no_sync, write back) is done by the
gradients' `ArrayKind`, so it runs where the data is, on the caller's current stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays.buffer import HOST, describe
from .._arrays.kinds import ArrayKind, kind_of
from .plan import ParamSpec

__all__ = ["BucketMemory"]


class BucketMemory:
    """The arrays of one GradientBucketer: placement, checks and element-wise work."""

    def __init__(self) -> None:
        self.kind: ArrayKind | None = None
        self._like: Any = None
        self._device = HOST

    @property
    def placed(self) -> bool:
        """True once the first gradient has decided where the buckets live."""
        return self.kind is not None

    def place(self, first: Any) -> None:
        """Puts the buckets where the array ``first`` (as `gradient` returned it) lives."""
        kind = kind_of(first)
        if kind is None:
            raise TypeError(
                f"gradients of type {type(first).__name__} live on a GPU, and ringreduce "
                "allocates GPU buckets for torch and cupy arrays only"
            )
        self.kind = kind
        self._like = first
        self._device = describe(first, "grad").device

    def where(self) -> str:
        """'host memory' or 'cuda:N', for messages."""
        return "host memory" if self._device == HOST else f"cuda:{self._device}"

    def gradient(self, spec: ParamSpec, grad: Any, *, writable: bool = True) -> Any:
        """The gradient as the array the bucket work operates on (a numpy view of host
        memory, or the GPU array itself), checked against its registration (and writable,
        when the result is to be written back into it)."""
        buf = describe(grad, "grad")
        if buf.shape != spec.shape:
            raise ValueError(
                f"parameter {spec.name!r}: gradient shape {buf.shape} != registered {spec.shape}"
            )
        if buf.dtype != spec.dtype.name:
            raise TypeError(
                f"parameter {spec.name!r}: gradient dtype {buf.dtype} != registered {spec.dtype}"
            )
        if buf.readonly and writable:
            raise ValueError(
                f"parameter {spec.name!r}: gradient is read-only, but wait() "
                f"writes the reduced gradient back into it"
            )
        if self.placed and buf.device != self._device:
            raise ValueError(
                f"parameter {spec.name!r}: gradient is in {buf.where}, but the buckets are in "
                f"{self.where()}, where the first gradient handed over lived; keep them in "
                "one place"
            )
        if buf.host is not None:
            return buf.host
        if not buf.contiguous:
            raise ValueError(
                f"parameter {spec.name!r}: a GPU gradient must be contiguous, since wait() "
                "writes the reduced gradient back into it"
            )
        return grad

    @property
    def on_host(self) -> bool:
        """True when the buckets live in host memory (where windows can hold them)."""
        return self._device == HOST

    def bucket(self, elements: int, dtype: np.dtype, window: Any = None) -> Any:
        """A zeroed flat bucket of ``elements`` of ``dtype`` where the gradients live.

        ``window``: the communicator's ``empty``, to put the bucket in a window that
        every rank of the host maps (collective: every rank allocates its buckets in the
        same order), host memory or the gradients' GPU; the all-reduce then reads the
        peers' buckets in place."""
        assert self.kind is not None
        if window is None:
            return self.kind.zeros(self._like, (elements,), dtype)
        if self.on_host:
            raw = window(elements * dtype.itemsize, np.uint8)
        else:
            raw = window(elements * dtype.itemsize, np.uint8, device=self._device)
        return self.kind.over_bytes(raw, dtype)

    def view(self, bucket: Any, offset: int, shape: tuple[int, ...]) -> Any:
        """One parameter's place in its bucket, shaped like the parameter."""
        assert self.kind is not None
        return self.kind.view(bucket, offset, shape)

    def fill(self, view: Any, source: Any, divisor: int) -> None:
        """view = source / divisor (divisor 1: a plain copy); zeros for source None. The
        wire dtype may be narrower (bfloat16): the quotient is computed in the gradient's
        dtype and rounded once into the bucket."""
        assert self.kind is not None
        if source is None:
            self.kind.assign(view, 0)
        elif divisor != 1:
            self.kind.divide(view, source, divisor)
        else:
            self.kind.assign(view, source)

    def snapshot(self, bucket: Any) -> Any:
        """A copy of a bucket (its local contribution, before the all-reduce)."""
        assert self.kind is not None
        return self.kind.copy(bucket)

    def restore(self, bucket: Any, snapshot: Any, factor: float = 1.0) -> None:
        """bucket = snapshot (x factor, for contributions divided for another world size)."""
        assert self.kind is not None
        self.kind.assign(bucket, snapshot)
        if factor != 1.0:
            self.kind.scale(bucket, factor)

    def accumulate(self, acc: Any, grad: Any) -> Any:
        """acc + grad, into acc (a copy of grad when acc is None); returns the accumulator."""
        assert self.kind is not None
        if acc is None:
            return self.kind.copy(grad)
        self.kind.add_(acc, grad)
        return acc

    def write_back(self, grad: Any, view: Any) -> None:
        """grad = the reduced value from the bucket, cast to the gradient's dtype."""
        assert self.kind is not None
        self.kind.assign(grad, view)
