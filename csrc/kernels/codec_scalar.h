// The per-value conversions the codecs share between the CPU loops
// (codec_impl.h) and the CUDA kernels (codec_cuda.cu), written once so that
// both give numpy's and ml_dtypes' bits.
#pragma once

#include <cstdint>

#include "reduce/half.h"

namespace rr {
namespace codec {

// float32 -> bfloat16 as ml_dtypes casts it: round to nearest even, and every
// nan to the sign and 0x7fc0 (half.h's float_to_bfloat16 keeps nan payloads).
RR_HD uint16_t to_bf16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = ((x >> 16) & 0x8000u) | 0x7fc0u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// numpy's float32 -> float16 of a nan: the top 10 payload bits kept (one set
// if none is), where F16C and half.h make every nan 0x7e00.
RR_HD uint16_t numpy_half_nan(float f) {
  const uint32_t x = float_bits(f);
  uint32_t h = 0x7c00u + ((x & 0x007fffffu) >> 13);
  if (h == 0x7c00u) ++h;
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | h);
}

// float32 -> float16 as numpy casts it, nan payloads included.
RR_HD uint16_t to_half_as_numpy(float f) {
  return (float_bits(f) & 0x7fffffffu) > 0x7f800000u ? numpy_half_nan(f) : float_to_half(f);
}

}  // namespace codec
}  // namespace rr
