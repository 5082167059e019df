"""Blocks, stochastic-rounding noise and nibble packing: the numpy reference pieces the
codecs (`codecs`) share, and that the C++ kernels (csrc/kernels/codec*.h,
csrc/kernels/dither.h) reproduce bit for bit."""

from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["BLOCK", "blocks_of", "dither", "seed_key"]

_F32 = np.float32
# Values sharing one scale: small enough that an outlier spoils few others, large enough
# that the 4-byte scale costs 0.8% of an int8 payload (CGX and ZeRO++ use 512-1024).
BLOCK = 512


def blocks_of(n: int) -> int:
    """How many blocks ``n`` values take."""
    return -(-n // BLOCK)


def _as_blocks(x: np.ndarray) -> np.ndarray:
    """x as a (blocks, BLOCK) array, the last block padded with zeros (a copy only then)."""
    n = x.size
    nb = blocks_of(n)
    if n == nb * BLOCK:
        return x.reshape(nb, BLOCK)
    padded = np.zeros(nb * BLOCK, _F32)
    padded[:n] = x
    return padded.reshape(nb, BLOCK)


def _max_abs(xb: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(largest finite |value| of each block, which blocks hold a non-finite value)."""
    # nan or inf where non-finite; abs: a block of -0.0 gives +0.0 (a -0.0 scale is a flag)
    amax = np.abs(np.maximum(xb.max(axis=1), -xb.min(axis=1)))
    bad = ~np.isfinite(amax)
    if bad.any():
        rows = xb[bad]
        amax[bad] = np.where(np.isfinite(rows), np.abs(rows), 0).max(axis=1)
    return amax.astype(_F32, copy=False), bad


_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1


def seed_key(seed: int) -> int:
    """The 64-bit key of stochastic rounding for ``seed``, a non-negative integer of
    any size (the collective's seeds take 127 bits): splitmix64 over its 64-bit words,
    lowest first."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed: must be >= 0, got {seed}")
    key = 0
    while True:
        z = ((key ^ (seed & _M64)) + 0x9E3779B97F4A7C15) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        key = z ^ (z >> 31)
        seed >>= 64
        if not seed:
            return key


def _mix32(h: np.ndarray) -> np.ndarray:
    """Chris Wellons' lowbias32, in place on uint32 (a bijection; csrc/kernels/dither.h)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    h ^= h >> np.uint32(16)
    return h


def dither(key: int, start: int, count: int) -> np.ndarray:
    """The stochastic-rounding noise of elements ``start .. start+count-1`` under the
    64-bit ``key``: float32 in [0, 1), 24 random bits each, a function of (key, index)
    alone. Element i draws ``mix32(mix32(i_lo ^ key_lo) ^ key_hi') >> 8`` times 2**-24,
    where i_lo is i's low 32 bits and key_hi' is key's high 32 bits plus 0x9E3779B9 per
    2**32 of i (the C++ kernels compute the same, csrc/kernels/dither.h)."""
    out = np.empty(count, _F32)
    done = 0
    while done < count:  # one 2**32 run of indices at a time: their key_hi' is one
        index = start + done
        low = index & _M32
        take = min(count - done, (1 << 32) - low)
        key_hi = ((key >> 32) + (index >> 32) * 0x9E3779B9) & _M32
        h = np.arange(low, low + take, dtype=np.uint32)
        h ^= np.uint32(key & _M32)
        _mix32(h)
        h ^= np.uint32(key_hi)
        _mix32(h)
        h >>= np.uint32(8)
        np.multiply(h, _F32(2.0**-24), out=out[done : done + take], dtype=_F32, casting="unsafe")
        done += take
    return out


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """int8 codes as bytes: as they are (8 bits), or two to a byte (4 bits, the first
    in the low nibble)."""
    if bits == 8:
        return codes.view(np.uint8)
    nibbles = (codes & 0x0F).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return nibbles[0::2] | (nibbles[1::2] << 4)


def _unpack(body: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The n int8 codes of `_pack`'s bytes."""
    if bits == 8:
        return body[:n].view(np.int8)
    both = np.empty(2 * body.size, np.uint8)
    both[0::2] = body & 0x0F
    both[1::2] = body >> 4
    return ((both[:n] ^ 8).astype(np.int8) - 8).astype(np.int8)
