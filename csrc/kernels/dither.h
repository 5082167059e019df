// The noise of stochastic rounding: a counter-based hash of (key, element
// index) -> uniform float in [0, 1), so any element's draw is computed
// independently of the others. That lets a vectorized loop (or a CUDA thread)
// draw for element i without a generator's sequential state, and lets the
// numpy reference (python/ringreduce/compression/codecs.py, _dither) compute
// the same bits with uint32 array arithmetic.
//
// The hash is two rounds of Chris Wellons' lowbias32 (a bijection of 32-bit
// words: xor-shifts and odd multiplies), keyed between the rounds. 32-bit
// multiplies vectorize on every x86-64 level (8 lanes with AVX2), where a
// 64-bit mix such as splitmix64 has no vector multiply before AVX-512.
#pragma once

#include <cstdint>

#include "reduce/half.h"  // RR_HD

namespace rr {
namespace codec {

RR_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The second round's key for the elements whose index has these upper 32
// bits: arrays of 2^32 values or more get a fresh permutation per 2^32.
RR_HD uint32_t dither_key_hi(uint64_t key, uint64_t index) {
  return static_cast<uint32_t>(key >> 32) + static_cast<uint32_t>(index >> 32) * 0x9e3779b9u;
}

// The 24-bit draw of element `index` as a float in [0, 1) (exact in float32).
RR_HD float dither_of(uint32_t key_lo, uint32_t key_hi, uint32_t index_lo) {
  const uint32_t h = mix32(mix32(index_lo ^ key_lo) ^ key_hi);
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-24f;
}

RR_HD float dither(uint64_t key, uint64_t index) {
  return dither_of(static_cast<uint32_t>(key), dither_key_hi(key, index),
                   static_cast<uint32_t>(index));
}

}  // namespace codec
}  // namespace rr
