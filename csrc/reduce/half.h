// float16 and bfloat16 <-> float32 conversions, written without branches so the
// compiler can vectorize loops over them, and usable from CUDA device code.
//
// float32 -> 16-bit rounds to nearest, ties to even, like numpy, ml_dtypes and
// torch. Subnormals, infinities and NaN (quieted) are handled.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RR_HD __host__ __device__ __forceinline__
#else
#define RR_HD inline
#endif

namespace rr {

RR_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

RR_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

RR_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + ((127u - 15u) << 23);
  // Inf/NaN: push the exponent to all ones.
  const uint32_t special = normal + ((128u - 16u) << 23);
  // Zero/subnormal: let the FPU renormalize by subtracting 2^-14.
  const float sub = bits_float(normal + (1u << 23)) - bits_float(113u << 23);
  const uint32_t out = exponent == 0x0f800000u ? special : (exponent == 0 ? float_bits(sub) : normal);
  return bits_float(out | sign);
}

RR_HD uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  // |f| >= 65536 (or Inf/NaN): Inf, or a quiet NaN.
  const uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // |f| < 2^-14: the result is subnormal; adding 0.5 aligns the mantissa so the
  // FPU does the round-to-nearest-even for us.
  const uint32_t small = float_bits(bits_float(x) + 0.5f) - 0x3f000000u;
  // Normal range: rebias the exponent and round to nearest even by hand.
  const uint32_t odd = (x >> 13) & 1u;
  const uint32_t normal = (x + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd) >> 13;
  const uint32_t out = x >= 0x47800000u ? big : (x < 0x38800000u ? small : normal);
  return static_cast<uint16_t>(out | (sign >> 16));
}

RR_HD float bfloat16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

RR_HD uint16_t float_to_bfloat16(float f) {
  const uint32_t x = float_bits(f);
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

}  // namespace rr
