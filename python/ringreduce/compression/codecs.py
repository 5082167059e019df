"""Codecs: how a run of float32 values travels in fewer bytes, and the registry of them.

Terms used below:

- *payload*: the bytes one encoded run of values occupies on the wire. Its size depends
  on the number of values only (``payload_bytes(n)``), so that every rank knows, without
  asking, how many bytes each peer sends.
- *block*: ``BLOCK`` consecutive values that share one scale (the last block of a run
  may be shorter). A payload is the blocks' scales (float32, one per block) followed by
  the values' codes.
- *algebra*: what a reduction may do with payloads. "linear": the sum of decoded
  payloads is what matters and a cast of a partial sum is as good as the cast of the
  parts (bf16); "requantize": a partial sum needs new scales, so it is decoded, added in
  float32 and encoded again (the block codecs); "gather": payloads cannot be combined
  at all, every rank decodes every rank's payload (top-k, signs).

The built-in codecs run C++ kernels (``_core.codec_*``, csrc/kernels/codec.h) when the
extension has them, and the numpy code below otherwise: the numpy code is the reference,
and the kernels produce its bytes exactly (tests/test_codec_kernels.py), so ranks that
run different paths still agree. `use_kernels` switches every built-in codec to numpy
(or back); each method's ``use_numpy=True`` does it for one call. The numpy code works
on whole arrays, never element by element or block by block in Python.

Stochastic rounding draws from a counter-based hash of (key, element index) (`dither`),
not from a generator's stream, so that a vectorized or parallel kernel can draw for any
element on its own; `seed_key` folds a call's seed, an integer of any size, into the
hash's 64-bit key.
"""

from __future__ import annotations

import zlib
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from .._arrays.bfloat16 import bfloat16
from .blocks import (
    BLOCK,
    _as_blocks,
    _max_abs,
    _pack,
    _unpack,
    blocks_of,
    dither,
    seed_key,
)

__all__ = [
    "ALGEBRAS",
    "BLOCK",
    "BFloat16Codec",
    "BlockIntCodec",
    "Codec",
    "Float16Codec",
    "codec_names",
    "dither",
    "get_codec",
    "register_codec",
    "seed_key",
    "use_kernels",
]

ALGEBRAS = ("linear", "requantize", "gather")
_F32 = np.float32


class Codec:
    """A way to send float32 values in fewer bytes. Subclass it, set ``name`` and
    ``algebra``, implement the three methods, and `register_codec` an instance (or pass
    the instance itself as ``compression=``).

    ``max_error`` is the relative error (``|result - exact| / |exact|`` over the canary's
    sample) past which the quality canary switches a communicator from this codec to the
    exact path.
    """

    name: str = ""
    algebra: str = "requantize"
    max_error: float = 0.1

    def payload_bytes(self, n: int) -> int:
        """The size in bytes of the payload of ``n`` values (a function of n alone)."""
        raise NotImplementedError

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        """The payload (uint8, ``payload_bytes(x.size)`` long) of ``x``, a 1-D
        C-contiguous float32 array. ``seed`` seeds any randomness (stochastic rounding):
        the same x and seed must give the same bytes on every rank."""
        raise NotImplementedError

    def decode(self, payload: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` float32 values that ``payload`` (uint8, ``payload_bytes(n)`` long)
        stands for, as a new array the caller may change."""
        raise NotImplementedError

    def decode_add(self, payloads: Sequence[np.ndarray], n: int, acc: np.ndarray) -> None:
        """``acc += decode(p, n)`` for each payload p in order, in float32 (``acc``: a
        float32 array of n values). The built-in codecs do it in one pass over acc."""
        for payload in payloads:
            acc += np.asarray(self.decode(payload, n), _F32)

    def encode_feedback(self, x: np.ndarray, residual: np.ndarray, seed: int = 0) -> np.ndarray:
        """Error feedback's encode: the payload of ``v = x + residual``, leaving in
        ``residual`` (float32, x's length, updated in place) what it dropped,
        ``v - decode(payload)``. The built-in codecs do it in one pass."""
        v = np.asarray(x, _F32) + residual
        payload = self.encode(v, seed)
        residual[:] = v - np.asarray(self.decode(payload, v.size), _F32)
        return payload

    @property
    def tag(self) -> int:
        """A 32-bit fingerprint of the codec's name: ranks compare them, so that two
        ranks using different codecs in one call fail instead of misreading bytes."""
        return zlib.crc32(self.name.encode())

    def __repr__(self) -> str:
        return f"<ringreduce codec {self.name!r} ({self.algebra})>"


_KERNELS = hasattr(_core, "codec_encode")


def use_kernels(enabled: Optional[bool] = None) -> bool:
    """Whether the built-in codecs run the C++ kernels: sets it when ``enabled`` is
    given (False: the numpy reference everywhere in this process; True: the kernels,
    where this build of the extension has them). Returns the setting now in force."""
    global _KERNELS
    if enabled is not None:
        _KERNELS = bool(enabled) and hasattr(_core, "codec_encode")
    return _KERNELS


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=_F32).reshape(-1)


class _Kernel:
    """A built-in codec's C++ kernels (``_core.codec_*``), by kernel name, with the
    numpy methods ``_encode_np(x, key, first)`` and ``_decode_np(payload, n)`` as the
    reference. Mixed into the built-in codecs after Codec.

    Their encodes take ``first``, the index of ``x[0]`` in the array ``x`` is a piece
    of: the dither of stochastic rounding is a function of (key, that index), so a piece
    that starts at a block boundary encodes to the bytes the whole array's blocks there
    would, and a call cut into pieces gives the bits of the same call whole."""

    kernel: str = ""

    def payload_bytes(self, n: int) -> int:  # pragma: no cover - the codecs define it
        raise NotImplementedError

    def _encode_np(  # pragma: no cover
        self, x: np.ndarray, key: int, first: int = 0
    ) -> np.ndarray:
        raise NotImplementedError

    def _decode_np(self, payload: np.ndarray, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def encode(
        self, x: np.ndarray, seed: int = 0, *, first: int = 0, use_numpy: bool = False
    ) -> np.ndarray:
        """See `Codec.encode`; ``first``: x[0]'s index in the array x is a piece of (the
        class's docstring); ``use_numpy``: the numpy reference for this call."""
        x = _f32(x)
        if use_numpy or not _KERNELS:
            return self._encode_np(x, seed_key(seed), first)
        payload = np.empty(self.payload_bytes(x.size), np.uint8)
        _core.codec_encode(self.kernel, x, seed_key(seed), payload, first=first)
        return payload

    def decode(self, payload: np.ndarray, n: int, *, use_numpy: bool = False) -> np.ndarray:
        """See `Codec.decode`; ``use_numpy``: the numpy reference for this call."""
        payload = np.ascontiguousarray(payload[: self.payload_bytes(n)])
        if use_numpy or not _KERNELS:
            return self._decode_np(payload, n)
        out = np.empty(n, _F32)
        _core.codec_decode(self.kernel, payload, n, out)
        return out

    def decode_add(
        self, payloads: Sequence[np.ndarray], n: int, acc: np.ndarray, *, use_numpy: bool = False
    ) -> None:
        """See `Codec.decode_add`; ``use_numpy``: the numpy reference for this call."""
        if use_numpy or not _KERNELS or acc.dtype != _F32 or not acc.flags.c_contiguous:
            for payload in payloads:
                acc += self.decode(payload, n, use_numpy=use_numpy)
            return
        size = self.payload_bytes(n)
        _core.codec_decode_add(
            self.kernel, [np.ascontiguousarray(p[:size]) for p in payloads], n, acc.reshape(-1)
        )

    def encode_feedback(
        self,
        x: np.ndarray,
        residual: np.ndarray,
        seed: int = 0,
        *,
        first: int = 0,
        use_numpy: bool = False,
    ) -> np.ndarray:
        """See `Codec.encode_feedback`; ``first`` as in `encode`; ``use_numpy``: the
        numpy reference for this call."""
        x = _f32(x)
        fits = (
            residual.dtype == _F32
            and residual.flags.c_contiguous
            and residual.flags.writeable
            and residual.size == x.size
        )
        if use_numpy or not _KERNELS or not fits:
            v = x + residual
            payload = self.encode(v, seed, first=first, use_numpy=use_numpy)
            residual[:] = v - self.decode(payload, v.size, use_numpy=use_numpy)
            return payload
        payload = np.empty(self.payload_bytes(x.size), np.uint8)
        _core.codec_encode(
            self.kernel, x, seed_key(seed), payload, residual.reshape(-1), first=first
        )
        return payload


def _split(payload: np.ndarray, nb: int) -> Tuple[np.ndarray, np.ndarray]:
    """(the blocks' float32 scales, the codes' bytes) of a block payload."""
    return payload[: 4 * nb].view(_F32), payload[4 * nb :]


# ---- 16-bit casts -----------------------------------------------------------


class BFloat16Codec(_Kernel, Codec):
    """bfloat16: float32's range, 8 bits of mantissa (relative error <= 2**-9 per value,
    round to nearest even). No scales: 2 bytes per value. inf and nan pass as they are."""

    name = "bf16"
    kernel = "bf16"
    algebra = "linear"
    max_error = 0.02

    def payload_bytes(self, n: int) -> int:
        return 2 * n

    def _encode_np(self, x: np.ndarray, key: int, first: int = 0) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # a signalling nan's cast warns
            return x.astype(bfloat16("the bf16 codec's numpy path")).view(np.uint8)

    def _decode_np(self, payload: np.ndarray, n: int) -> np.ndarray:
        return payload[: 2 * n].view(bfloat16("the bf16 codec's numpy path")).astype(_F32)


class Float16Codec(_Kernel, Codec):
    """float16 values scaled per block by a power of two, so that the block's largest
    |value| lands in [2**14, 2**15): no value overflows float16's 65504, whatever the
    input's (or a sum's) magnitude, and small blocks keep their 11 bits of precision
    instead of going subnormal. Scaling by a power of two adds no rounding of its own.
    Relative error <= 2**-11 per value, plus 2**-39 of the block's largest |value|
    (values that become float16 subnormals: half their step, 2**-25 of the scaled
    largest's power of two, is up to 2**-39 of the largest itself). A value within
    2**-12 of float32's largest may round to 2**15 and so decode to inf. inf and nan
    pass as they are."""

    name = "fp16"
    kernel = "fp16"
    algebra = "requantize"
    max_error = 0.02

    def payload_bytes(self, n: int) -> int:
        return 4 * blocks_of(n) + 2 * n

    def _encode_np(self, x: np.ndarray, key: int, first: int = 0) -> np.ndarray:
        n = x.size
        xb = _as_blocks(x)
        amax, _ = _max_abs(xb)
        # amax < 2**e; the scale 2**(e-15) brings it under 2**15. Clipped so that the
        # scale and its inverse stay normal float32 numbers.
        exponent = np.clip(np.frexp(amax)[1] - 15, -126, 126)
        scale = np.ldexp(_F32(1), exponent).astype(_F32)
        with np.errstate(invalid="ignore"):  # a signalling nan's cast warns
            codes = (xb * np.ldexp(_F32(1), -exponent).astype(_F32)[:, None]).astype(np.float16)
        payload = np.empty(self.payload_bytes(n), np.uint8)
        head, body = _split(payload, xb.shape[0])
        head[:] = scale
        body[:] = codes.reshape(-1)[:n].view(np.uint8)
        return payload

    def _decode_np(self, payload: np.ndarray, n: int) -> np.ndarray:
        nb = blocks_of(n)
        head, body = _split(payload[: self.payload_bytes(n)], nb)
        out = np.zeros(nb * BLOCK, _F32)
        out[:n] = body.view(np.float16)
        # A signalling nan's product warns, and so does float32's largest, whose code
        # may round up to 2**15 (the decoded value is then inf).
        with np.errstate(invalid="ignore", over="ignore"):
            out.reshape(nb, BLOCK)[:] *= head[:, None]
        return out[:n]


# ---- block integers ----------------------------------------------------------


class BlockIntCodec(_Kernel, Codec):
    """Signed integers of ``bits`` bits, one float32 scale (largest |value| / qmax) per
    block, stochastic rounding: a value v is sent as floor(v / scale + u), u uniform in
    [0, 1), so its expected decoded value is v (no bias) and the error of one value is
    below one scale step. qmax = 2**(bits-1) - 1 (127 for int8, 7 for int4).

    A block holding inf or nan keeps them exact: its scale is sent negated (the sign
    flags the block), its finite values use qmax - 1 levels, and the codes qmax, -qmax
    and -qmax - 1 stand for +inf, -inf and nan. Decoded and summed in float32, they give
    what the exact sum gives (inf + finite = inf, inf + -inf = nan, nan + x = nan).

    A value within one step of float32's largest may decode to inf (qmax * scale
    rounds past it). A block whose largest |value| is below 2**-100 is multiplied by
    2**100 (exactly) before ``levels / largest`` is taken, which would overflow to inf
    for such blocks.
    """

    algebra = "requantize"

    def __init__(self, bits: int, name: str, max_error: float):
        if bits not in (4, 8):
            raise ValueError(f"BlockIntCodec: bits must be 4 or 8, got {bits}")
        self.bits = bits
        self.kernel = f"int{bits}"
        self.name = name
        self.max_error = max_error
        self.qmax = (1 << (bits - 1)) - 1

    def payload_bytes(self, n: int) -> int:
        return 4 * blocks_of(n) + (n * self.bits + 7) // 8

    def _encode_np(self, x: np.ndarray, key: int, first: int = 0) -> np.ndarray:
        n = x.size
        xb = _as_blocks(x)
        nb = xb.shape[0]
        amax, bad = _max_abs(xb)
        levels = np.full(nb, self.qmax, _F32)
        levels[bad] = self.qmax - 1
        scale = amax / levels
        top = amax
        tiny = amax < _F32(2.0**-100)
        inverse = np.zeros(nb, _F32)
        # invalid: inf * 0 in a non-finite block's zero scale, signalling nans.
        with np.errstate(invalid="ignore"):
            if tiny.any():  # levels / amax would overflow: lift these blocks by 2**100
                lift = np.where(tiny, _F32(2.0**100), _F32(1))
                xb = xb * lift[:, None]
                top = amax * lift
            np.divide(levels, top, out=inverse, where=top > 0)
            v = xb * inverse[:, None]
            v += dither(key, first, v.size).reshape(v.shape)
            np.floor(v, out=v)
            np.clip(v, -levels[:, None], levels[:, None], out=v)
        if bad.any():
            rows = xb[bad]
            special = v[bad]
            special[np.isposinf(rows)] = self.qmax
            special[np.isneginf(rows)] = -self.qmax
            special[np.isnan(rows)] = -self.qmax - 1
            v[bad] = special
            scale[bad] = -scale[bad]  # the flag: -0.0 counts too (np.signbit)
        codes = v.reshape(-1)[:n].astype(np.int8)
        payload = np.empty(self.payload_bytes(n), np.uint8)
        head, body = _split(payload, nb)
        head[:] = scale
        body[:] = _pack(codes, self.bits)
        return payload

    def _decode_np(self, payload: np.ndarray, n: int) -> np.ndarray:
        nb = blocks_of(n)
        head, body = _split(payload[: self.payload_bytes(n)], nb)
        codes = np.zeros(nb * BLOCK, np.int8)
        codes[:n] = _unpack(body, n, self.bits)
        cb = codes.reshape(nb, BLOCK)
        out = cb.astype(_F32)
        with np.errstate(over="ignore"):  # qmax * scale may pass float32's largest (inf)
            out *= np.abs(head)[:, None]
        flagged = np.signbit(head)
        if flagged.any():
            rows, values = cb[flagged], out[flagged]
            values[rows == self.qmax] = np.inf
            values[rows == -self.qmax] = -np.inf
            values[rows == -self.qmax - 1] = np.nan
            out[flagged] = values
        return out.reshape(-1)[:n]


# ---- the registry -------------------------------------------------------------

_CODECS: Dict[str, Codec] = {}
AUTO = "auto"


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Makes ``codec`` usable by name (``compression=codec.name``). ValueError for a name
    already taken (unless ``replace``), "auto", or an unknown algebra. Returns it."""
    if not isinstance(codec, Codec):
        raise TypeError(f"register_codec: expected a Codec instance, got {type(codec).__name__}")
    if not isinstance(codec.name, str) or not codec.name or codec.name == AUTO:
        raise ValueError(
            f"register_codec: a codec needs a name other than '' and 'auto', got {codec.name!r}"
        )
    if codec.algebra not in ALGEBRAS:
        raise ValueError(
            f"register_codec: codec {codec.name!r} has algebra {codec.algebra!r}; expected "
            f"one of {', '.join(ALGEBRAS)}"
        )
    if codec.name in _CODECS and not replace and _CODECS[codec.name] is not codec:
        raise ValueError(
            f"register_codec: a codec named {codec.name!r} is registered already (pass "
            "replace=True to replace it)"
        )
    _CODECS[codec.name] = codec
    return codec


def codec_names() -> Tuple[str, ...]:
    """The names ``compression=`` accepts: every registered codec, then "auto"."""
    return (*_CODECS, AUTO)


def get_codec(compression: Union[str, Codec]) -> Codec:
    """The codec a ``compression=`` argument names (a Codec instance is itself).
    ValueError listing the codecs for an unknown name; "auto" is not a codec (the
    collective decides for it)."""
    if isinstance(compression, Codec):
        return compression
    codec = _CODECS.get(compression) if isinstance(compression, str) else None
    if codec is None:
        raise ValueError(
            f"compression: unknown codec {compression!r}; use one of "
            f"{', '.join(repr(c) for c in codec_names())}, None, or a Codec instance"
        )
    return codec


register_codec(BFloat16Codec())
register_codec(Float16Codec())
# max_error: about 10x what each gives on Gaussian data (0.5% for int8, 9% for int4).
register_codec(BlockIntCodec(8, "int8", max_error=0.1))
register_codec(BlockIntCodec(4, "int4", max_error=0.5))
