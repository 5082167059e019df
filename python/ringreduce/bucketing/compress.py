"""Compression in a GradientBucketer: each bucket's all-reduce through a codec
(``comm.all_reduce(bucket, compression=...)``, docs/compression.md) or through PowerSGD
(compression/powersgd.py), with the error-feedback state kept per parameter name.

Terms:
- *flat residual*: one float32 array per bucket, as long as the bucket and where it is
  (a GPU array beside a CUDA bucket), handed to the collective as ``error_feedback=``
  (the collective updates it in place). Parameter p's residual is the slice of its
  bucket's flat residual at p's offset, so a step costs no copy of residuals at all.
- The `ErrorFeedback` keeps the same residuals *by parameter name*: it is filled from
  the flat residuals when it is read (`CompressedBuckets.error_feedback`, `state_dict`)
  and read into them when the buckets are made and when a state is loaded. A bucketer
  with another plan (another ``bucket_mb``, other parameters around) therefore picks up
  each parameter's residual where its own buckets put it.

A bucket is launched in `GradientBucketer.ready`, as an exact bucket is: its call through
a codec goes to the communicator's lane (_comm/compressed/lane.py), which encodes and exchanges it
in the background, in launch order, while backward goes on. PowerSGD calls are
asynchronous too: a bucket's start moves the previous bucket on to its Q all-reduce.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays.buffer import describe
from .._arrays.kinds import kind_of
from ..compression.codecs import AUTO, Codec, get_codec
from ..compression.feedback import ErrorFeedback
from ..compression.powersgd import PowerSGD

__all__ = ["CompressedBuckets", "CompressionState", "check_options", "compressed_buckets"]

_VERSION = 1


def check_options(
    compression: Any,
    error_feedback: Any,
    powersgd_rank: Any,
    average: bool,
    fault_tolerant: bool,
    comm_dtype: Any,
) -> None:
    """ValueError (before any rank talks) for combinations that cannot work."""
    if compression is not None and compression != AUTO:
        get_codec(compression)  # ValueError listing the codecs for an unknown name
    if powersgd_rank is not None:
        if compression is not None:
            raise ValueError(
                "compression= and powersgd_rank= are two ways of compressing a bucket: "
                "pass one of them"
            )
        if int(powersgd_rank) < 1:
            raise ValueError(f"powersgd_rank must be at least 1, got {powersgd_rank}")
        if not average:
            raise ValueError("powersgd_rank needs average=True: PowerSGD averages over ranks")
        if fault_tolerant:
            raise ValueError(
                "powersgd_rank cannot be combined with fault_tolerant=True: a step that "
                "loses a rank would have to undo PowerSGD's residuals and warm-start "
                "factors of every bucket already reduced; use compression='int8' with "
                "error_feedback=True, or fault_tolerant=False"
            )
        if comm_dtype is not None:
            raise ValueError("powersgd_rank sends float32 factors: comm_dtype must be None")
    elif error_feedback and compression is None:
        raise ValueError(
            "error_feedback=True keeps what a codec drops: it needs compression= (a codec "
            "name, 'auto' or a Codec) or powersgd_rank= (which keeps its own)"
        )


def compressed_buckets(
    comm: Any,
    compression: Any,
    error_feedback: Any,
    powersgd_rank: Any,
    average: bool,
    fault_tolerant: bool,
    comm_dtype: Any,
) -> CompressedBuckets | None:
    """The bucketer's compression, checked; None when it does not compress."""
    check_options(compression, error_feedback, powersgd_rank, average, fault_tolerant, comm_dtype)
    if compression is None and powersgd_rank is None:
        return None
    return CompressedBuckets(comm, compression, error_feedback, powersgd_rank)


class CompressedBuckets:
    """What a GradientBucketer does differently when it compresses: how a bucket is
    reduced, and the state that outlives a step (residuals, PowerSGD's factors)."""

    def __init__(
        self, comm: Any, compression: Any, error_feedback: Any, powersgd_rank: Any
    ) -> None:
        self.compression = compression
        self.powersgd = None if powersgd_rank is None else PowerSGD(comm, int(powersgd_rank))
        if isinstance(error_feedback, ErrorFeedback):
            self._ef: ErrorFeedback | None = error_feedback
        else:
            self._ef = ErrorFeedback() if error_feedback and compression is not None else None
        self._flats: list[np.ndarray] = []
        self._layout: list[list[tuple[str, int, int]]] = []  # per bucket: (name, offset, n)
        self._saved: list[np.ndarray | None] = []  # fault tolerance: flats as launched

    @property
    def codec_name(self) -> str | None:
        c = self.compression
        return c.name if isinstance(c, Codec) else c

    def settings(self) -> dict:
        """What every rank must agree on (joins the bucketer's plan check)."""
        return {
            "compression": self.codec_name,
            "error_feedback": self._ef is not None,
            "powersgd_rank": None if self.powersgd is None else self.powersgd.rank,
        }

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """Codecs sum in float32 and refuse float64: float64 gradients travel in float32
        buckets (and come back as float64), as the DDP hooks do."""
        if self.compression is not None and dtype == np.float64:
            return np.dtype(np.float32)
        return dtype

    # ---- the buckets -------------------------------------------------------------------

    def setup(self, buckets: list[Any], specs: list[Any]) -> None:
        """Called once the plan is fixed: notes every bucket's parameters (name, offset,
        size), makes the flat residuals and reads the saved ones into them."""
        if self.powersgd is not None and buckets:
            where = describe(buckets[0].buffer, "bucket").where
            if where != "host memory":
                raise TypeError(
                    f"powersgd_rank: PowerSGD runs on host gradients, and these are on "
                    f"{where}; use compression= (a codec: it encodes on the GPU) or keep "
                    "the gradients in host memory"
                )
        self._layout = layouts = [
            [(specs[i].name, at, specs[i].numel) for i, at in zip(b.params, b.offsets)]
            for b in buckets
        ]
        if self._ef is None:
            return
        # Each flat residual lives where its bucket does (on the GPU for CUDA buckets).
        self._flats = [
            kind_of(b.buffer).zeros(b.buffer, (sum(n for _, _, n in layout),), np.float32)
            for b, layout in zip(buckets, layouts)
        ]
        self._saved = [None] * len(layouts)
        self._read_ef()

    def _read_ef(self) -> None:
        assert self._ef is not None
        have = set(self._ef.keys())
        for i, layout in enumerate(self._layout):
            flat = self._flats[i]
            host = flat if isinstance(flat, np.ndarray) else np.zeros(flat.shape, np.float32)
            for name, at, n in layout:
                host[at : at + n] = self._ef.key(name).residual(n) if name in have else 0
            if host is not flat:
                self._flats[i] = kind_of(flat).from_host(flat, host)

    def _write_ef(self) -> None:
        assert self._ef is not None
        for flat, layout in zip(self._flats, self._layout):
            host = flat if isinstance(flat, np.ndarray) else kind_of(flat).to_host(flat)
            for name, at, n in layout:
                self._ef.key(name).residual(n)[:] = host[at : at + n]

    def issue(self, comm: Any, bucket: Any, views: list[Any]) -> Any:
        """Reduces one bucket; returns its Work (the engine's, or a LaneWork for a call
        the engine does not take: compressed/lane.py).
        ``views``: its parameters' places in the bucket, shaped like them."""
        if self.powersgd is not None:
            names = [name for name, _, _ in self._layout[bucket.index]]
            return self.powersgd.start(views, names)
        residual = self._flats[bucket.index] if self._ef is not None else None
        return comm.all_reduce(
            bucket.buffer,
            op=bucket.op,
            out=bucket.buffer,
            async_op=True,
            compression=self.compression,
            error_feedback=residual,
        )

    def snapshot(self, bucket: Any) -> None:
        """Fault tolerance: keeps the bucket's residual as it was at launch, since the
        call changes it and a replay after a shrink must start from it again."""
        if self._ef is not None:
            flat = self._flats[bucket.index]
            self._saved[bucket.index] = kind_of(flat).copy(flat)

    def restore(self, bucket: Any, factor: float) -> None:
        """The bucket's residual as at launch (x factor: a 16-bit bucket's residual is
        in units of the gradient divided by the old world size)."""
        saved = self._saved[bucket.index] if self._ef is not None else None
        if saved is not None:
            flat = self._flats[bucket.index]
            if isinstance(flat, np.ndarray):
                np.multiply(saved, np.float32(factor), out=flat)
            else:
                kind_of(flat).assign(flat, saved)
                kind_of(flat).scale(flat, np.float32(factor))

    # ---- state -------------------------------------------------------------------------

    @property
    def error_feedback(self) -> ErrorFeedback | None:
        """The residuals by parameter name, brought up to date (None without error
        feedback)."""
        if self._ef is not None and self._flats:
            self._write_ef()
        return self._ef

    def state_dict(self) -> dict:
        ef = self.error_feedback
        return {
            "version": _VERSION,
            "error_feedback": None if ef is None else ef.state_dict(),
            "powersgd": None if self.powersgd is None else self.powersgd.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Loads what `state_dict` saved, by parameter name. A state without residuals
        (or PowerSGD state) leaves this one's as they are; one with them, loaded where
        they are not used, is ignored (switching compression off between runs)."""
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ValueError(
                f"GradientBucketer.load_state_dict: expected a dict of version {_VERSION} "
                "from state_dict()"
            )
        if self._ef is not None and state.get("error_feedback") is not None:
            self._ef.load_state_dict(state["error_feedback"])
            if self._flats:
                self._read_ef()
        if self.powersgd is not None and state.get("powersgd") is not None:
            self.powersgd.load_state_dict(state["powersgd"])


class CompressionState:
    """GradientBucketer's methods for the state that outlives a step (a mixin: they read
    the bucketer's ``_compress``)."""

    _compress: CompressedBuckets | None

    @property
    def error_feedback(self) -> ErrorFeedback | None:
        """The `ErrorFeedback` of ``error_feedback=True``: residuals by parameter name,
        up to date (None without error feedback)."""
        return None if self._compress is None else self._compress.error_feedback

    def state_dict(self) -> dict:
        """What outlives a step, by parameter name, so that a bucketer with another plan
        can load it: ``{"version": 1, "error_feedback": ErrorFeedback.state_dict(),
        "powersgd": PowerSGD.state_dict()}`` (None where unused). This rank's own."""
        if self._compress is None:
            return {"version": _VERSION, "error_feedback": None, "powersgd": None}
        return self._compress.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` saved, before or after the first step."""
        if self._compress is not None:
            self._compress.load_state_dict(state)
