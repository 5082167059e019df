// The codec loops, compiled once per instruction-set variant (codec_variant.cc;
// see CMakeLists.txt), each variant in its own namespace RR_KERNEL_VARIANT.
//
// Terms: a block is kBlock values (the last may be shorter, m values); a
// block is encoded into local arrays of codes first and copied into the
// payload, so the loops below see aligned, unaliased buffers and GCC
// vectorizes them (bench/codec_speed.py measures the result). Every float
// operation is written in the order codecs.py performs it, and the variants
// are compiled with -ffp-contract=off, so no multiply-add is fused: the bits
// are numpy's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/codec.h"
#include "kernels/codec_scalar.h"
#include "kernels/codec_table.h"
#include "kernels/dither.h"
#include "reduce/half.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

namespace rr {
namespace codec {

namespace RR_KERNEL_VARIANT {

inline size_t blocks_of(size_t n) { return (n + kBlock - 1) / kBlock; }

// ---- a block's range ------------------------------------------------------

struct BlockRange {
  float amax;  // the largest finite |value|, +0 for none
  bool bad;    // whether the block holds inf or nan
};

// On non-negative floats the order of the bit patterns is the order of the
// values, so the maximum is an integer reduction, which vectorizes (a float
// max reduction does not without -ffast-math; GCC 12 vectorizes this one in
// int32, not in uint32).
inline BlockRange block_range(const float* v, size_t m) {
  const int32_t kInf = 0x7f800000;
  int32_t top = 0, any = 0;  // the largest finite |value|'s bits; the largest's
  for (size_t i = 0; i < m; ++i) {
    const int32_t a = __builtin_bit_cast(int32_t, v[i]) & 0x7fffffff;
    top = std::max(top, a < kInf ? a : 0);
    any = std::max(any, a);
  }
  return {__builtin_bit_cast(float, top), any >= kInf};
}

// ---- bf16 -----------------------------------------------------------------

struct BFloat16 {
  using Code = uint16_t;
  static constexpr bool kScaled = false;
  static size_t code_bytes(size_t m) { return 2 * m; }
  static void store(const Code* codes, size_t m, uint8_t* dst) { std::memcpy(dst, codes, 2 * m); }
  static void load(const uint8_t* src, size_t m, Code* codes) { std::memcpy(codes, src, 2 * m); }
  static float encode(const float* v, size_t m, uint64_t, uint64_t, Code* codes) {
    for (size_t i = 0; i < m; ++i) codes[i] = to_bf16(v[i]);
    return 0.0f;
  }
  static void decode(const Code* codes, float, size_t m, float* out) {
    for (size_t i = 0; i < m; ++i) out[i] = bits_float(static_cast<uint32_t>(codes[i]) << 16);
  }
};

// ---- fp16 -----------------------------------------------------------------

// codes[i] = float16(v[i] * factor), rounded to nearest even.
inline void scaled_to_half(const float* v, float factor, size_t m, uint16_t* codes) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  const __m256 f = _mm256_set1_ps(factor);
  for (; i + 8 <= m; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(v + i), f);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < m; ++i) codes[i] = float_to_half(v[i] * factor);
}

// out[i] = float(codes[i]) * factor.
inline void half_to_scaled(const uint16_t* codes, float factor, size_t m, float* out) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  const __m256 f = _mm256_set1_ps(factor);
  for (; i + 8 <= m; i += 8) {
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(y, f));
  }
#endif
  for (; i < m; ++i) out[i] = half_to_float(codes[i]) * factor;
}

struct Float16 {
  using Code = uint16_t;
  static constexpr bool kScaled = true;
  static size_t code_bytes(size_t m) { return 2 * m; }
  static void store(const Code* codes, size_t m, uint8_t* dst) { std::memcpy(dst, codes, 2 * m); }
  static void load(const uint8_t* src, size_t m, Code* codes) { std::memcpy(codes, src, 2 * m); }
  // A power of two brings the block's largest |value| into [2^14, 2^15).
  static float encode(const float* v, size_t m, uint64_t, uint64_t, Code* codes) {
    const BlockRange r = block_range(v, m);
    int exponent = 0;
    std::frexp(r.amax, &exponent);
    exponent = std::min(std::max(exponent - 15, -126), 126);
    const float inverse = std::ldexp(1.0f, -exponent);
    scaled_to_half(v, inverse, m, codes);
    if (r.bad) {
      for (size_t i = 0; i < m; ++i) {
        const float y = v[i] * inverse;
        if (std::isnan(y)) codes[i] = numpy_half_nan(y);
      }
    }
    return std::ldexp(1.0f, exponent);
  }
  static void decode(const Code* codes, float scale, size_t m, float* out) {
    half_to_scaled(codes, scale, m, out);
  }
};

// ---- block integers -------------------------------------------------------

template <int kBits>
struct BlockInt {
  using Code = int8_t;
  static constexpr bool kScaled = true;
  static constexpr int kQmax = (1 << (kBits - 1)) - 1;
  // Blocks start at even indices, so an int4 block starts on a whole byte.
  static size_t code_bytes(size_t m) { return (m * kBits + 7) / 8; }

  static void store(const Code* codes, size_t m, uint8_t* dst) {
    if (kBits == 8) {
      std::memcpy(dst, codes, m);
      return;
    }
    for (size_t k = 0; k < m / 2; ++k) {
      dst[k] = static_cast<uint8_t>((static_cast<uint8_t>(codes[2 * k]) & 0x0fu) |
                                    (static_cast<uint8_t>(codes[2 * k + 1]) << 4));
    }
    if (m % 2) dst[m / 2] = static_cast<uint8_t>(codes[m - 1]) & 0x0fu;
  }

  // Writes codes[0, m) (int4: m rounded up to even; callers' arrays hold kBlock).
  static void load(const uint8_t* src, size_t m, Code* codes) {
    if (kBits == 8) {
      std::memcpy(codes, src, m);
      return;
    }
    for (size_t k = 0; k < (m + 1) / 2; ++k) {
      const int lo = src[k] & 0x0f, hi = src[k] >> 4;
      codes[2 * k] = static_cast<int8_t>((lo ^ 8) - 8);
      codes[2 * k + 1] = static_cast<int8_t>((hi ^ 8) - 8);
    }
  }

  // floor(v / step + u), u the element's dither, clipped to +-levels; the
  // scale returned is negative for a block holding inf or nan (codecs.py's
  // BlockIntCodec explains the flag and the three special codes).
  static float encode(const float* v, size_t m, uint64_t key, uint64_t base, Code* codes) {
    const BlockRange r = block_range(v, m);
    const float levels = r.bad ? kQmax - 1 : kQmax;
    const float scale = r.amax / levels;
    // levels / amax overflows for amax below about 2^-121: such blocks are
    // lifted by 2^100 first (exactly: a power of two on tiny values).
    const float lift = r.amax < 0x1p-100f ? 0x1p100f : 1.0f;
    const float top = r.amax * lift;
    const float inverse = top > 0.0f ? levels / top : 0.0f;
    const uint32_t key_lo = static_cast<uint32_t>(key);
    const uint32_t key_hi = dither_key_hi(key, base);
    const uint32_t first = static_cast<uint32_t>(base);
    for (size_t i = 0; i < m; ++i) {
      float y = v[i] * lift;
      y = y * inverse;
      y = y + dither_of(key_lo, key_hi, first + static_cast<uint32_t>(i));
      // Clipping before the floor gives numpy's floor-then-clip (levels is a
      // whole number) and keeps nan out of the conversion (nan -> -levels;
      // its code is replaced below).
      y = y >= -levels ? y : -levels;
      y = y <= levels ? y : levels;
      int32_t t = static_cast<int32_t>(y);  // truncation; then down for negatives
      t -= static_cast<float>(t) > y ? 1 : 0;
      codes[i] = static_cast<int8_t>(t);
    }
    if (!r.bad) return scale;
    for (size_t i = 0; i < m; ++i) {
      if (std::isnan(v[i])) {
        codes[i] = static_cast<int8_t>(-kQmax - 1);
      } else if (std::isinf(v[i])) {
        codes[i] = static_cast<int8_t>(v[i] > 0 ? kQmax : -kQmax);
      }
    }
    return -scale;  // -0.0 too: decode tests the sign bit
  }

  static void decode(const Code* codes, float scale, size_t m, float* out) {
    const float step = std::fabs(scale);
    for (size_t i = 0; i < m; ++i) out[i] = static_cast<float>(codes[i]) * step;
    if (!std::signbit(scale)) return;
    const float inf = bits_float(0x7f800000u), nan = bits_float(0x7fc00000u);
    for (size_t i = 0; i < m; ++i) {
      const int c = codes[i];
      if (c == kQmax) out[i] = inf;
      if (c == -kQmax) out[i] = -inf;
      if (c == -kQmax - 1) out[i] = nan;
    }
  }
};

// ---- the drivers ------------------------------------------------------------

// Where block b's codes start in a payload of nb blocks (its scale: at 4b).
template <typename C>
size_t codes_offset(size_t nb, size_t b) {
  return (C::kScaled ? 4 * nb : 0) + C::code_bytes(b * kBlock);
}

template <typename C>
void encode_loop(const float* x, float* residual, size_t n, uint64_t key, uint64_t first,
                 uint8_t* payload) {
  const size_t nb = blocks_of(n);
  alignas(32) float v[kBlock];
  alignas(32) float back[kBlock];
  alignas(32) typename C::Code codes[kBlock];
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    const float* src = x + lo;
    if (residual != nullptr) {
      for (size_t i = 0; i < m; ++i) v[i] = src[i] + residual[lo + i];
      src = v;
    }
    const float scale = C::encode(src, m, key, first + lo, codes);
    if (C::kScaled) std::memcpy(payload + 4 * b, &scale, 4);
    C::store(codes, m, payload + codes_offset<C>(nb, b));
    if (residual != nullptr) {
      C::decode(codes, scale, m, back);
      for (size_t i = 0; i < m; ++i) residual[lo + i] = src[i] - back[i];
    }
  }
}

template <typename C>
float scale_of(const uint8_t* payload, size_t b) {
  float scale = 0.0f;
  if (C::kScaled) std::memcpy(&scale, payload + 4 * b, 4);
  return scale;
}

template <typename C>
void decode_loop(const uint8_t* payload, size_t n, float* out) {
  const size_t nb = blocks_of(n);
  alignas(32) typename C::Code codes[kBlock];
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    C::load(payload + codes_offset<C>(nb, b), m, codes);
    C::decode(codes, scale_of<C>(payload, b), m, out + lo);
  }
}

template <typename C>
void decode_add_loop(const uint8_t* const* payloads, size_t count, size_t n, float* acc) {
  const size_t nb = blocks_of(n);
  alignas(32) typename C::Code codes[kBlock];
  alignas(32) float values[kBlock];
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    float* a = acc + lo;
    for (size_t j = 0; j < count; ++j) {
      C::load(payloads[j] + codes_offset<C>(nb, b), m, codes);
      C::decode(codes, scale_of<C>(payloads[j], b), m, values);
      for (size_t i = 0; i < m; ++i) a[i] += values[i];
    }
  }
}

template <typename C>
CodecFns fns_for() {
  return {&encode_loop<C>, &decode_loop<C>, &decode_add_loop<C>};
}

inline CodecFns codec_fns(CodecKind kind) {
  switch (kind) {
    case CodecKind::kBFloat16:
      return fns_for<BFloat16>();
    case CodecKind::kFloat16:
      return fns_for<Float16>();
    case CodecKind::kInt8:
      return fns_for<BlockInt<8>>();
    case CodecKind::kInt4:
      return fns_for<BlockInt<4>>();
  }
  return {nullptr, nullptr, nullptr};
}

// The entry point of one variant, defined in codec_variant.cc.
CodecFns variant_codec_fns(CodecKind kind);

}  // namespace RR_KERNEL_VARIANT
}  // namespace codec
}  // namespace rr
