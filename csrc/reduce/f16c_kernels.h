// float16 and bfloat16 kernels with AVX2 (and F16C's conversions for
// float16), for the AVX2 variant.
//
// GCC does not vectorize the portable bit-twiddling conversions in half.h, so
// 16-bit floats would run scalar. vcvtph2ps/vcvtps2ph convert float16 exactly
// like half.h (IEEE round to nearest even, subnormals kept, NaN quieted), and
// Bf16 below is half.h's bfloat16 conversion eight lanes at a time, the same
// integer arithmetic. The vector min/max reproduce MinOp/MaxOp including NaN
// propagation and the choice between -0 and +0; the scalar tails use the
// shared functors.
#pragma once

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "reduce/ops.h"

namespace rr {
namespace RR_KERNEL_VARIANT {

struct VecSum {
  static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct VecProd {
  static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
// _mm256_min_ps(b, a) is "b < a ? b : a" (MinOp's order) but yields a when
// either is NaN; the blends then let a NaN b, and finally a NaN a, win.
struct VecMin {
  static __m256 apply(__m256 a, __m256 b) {
    __m256 m = _mm256_min_ps(b, a);
    m = _mm256_blendv_ps(m, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};
struct VecMax {
  static __m256 apply(__m256 a, __m256 b) {
    __m256 m = _mm256_max_ps(b, a);  // "b > a ? b : a", MaxOp's order
    m = _mm256_blendv_ps(m, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};

// Eight 16-bit values to float32 and back, for each 16-bit type.
struct F16 {
  using Type = Float16Type;
  static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(__m256 v, uint16_t* p) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};
struct Bf16 {
  using Type = BFloat16Type;
  static __m256 load(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // float_to_bfloat16: (x + 0x7fff + the kept half's lowest bit) >> 16, and a
  // NaN's upper half with its quiet bit set.
  static void store(__m256 v, uint16_t* p) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i upper = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(upper, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane holds 16 bits: pack them (per 128-bit half), then gather the halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

template <typename Conv, typename Vec, typename Op>
void half_reduce_loop(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) Conv::store(Vec::apply(Conv::load(x + i), Conv::load(y + i)), o + i);
  for (; i < n; ++i) o[i] = apply<typename Conv::Type, Op>(x[i], y[i]);
}

// reduce_all_loop for a 16-bit type (cpu_kernels_impl.h): every input of 8
// elements converted and combined in registers, in rank order, then divided
// (a multiply by the exact inverse for a power of two, as divide_loop does)
// and rounded once.
template <typename Conv, typename Vec, typename Op>
void half_reduce_all_loop(const void* const* in, size_t count, void* out, size_t n, int divisor) {
  using Type = typename Conv::Type;
  uint16_t* o = static_cast<uint16_t*>(out);
  const auto input = [in](size_t r) { return static_cast<const uint16_t*>(in[r]); };
  const bool power_of_two = divisor > 0 && (divisor & (divisor - 1)) == 0;
  const float div = static_cast<float>(divisor > 0 ? divisor : 1);
  const __m256 vdiv = _mm256_set1_ps(div);
  const __m256 inverse = _mm256_set1_ps(1.0f / div);
  const auto load = [](const uint16_t* p) { return Conv::load(p); };
  const auto finish = [&](__m256 acc, uint16_t* to) {
    if (divisor > 0) acc = power_of_two ? _mm256_mul_ps(acc, inverse) : _mm256_div_ps(acc, vdiv);
    Conv::store(acc, to);
  };
  size_t i = 0;
  // Two vectors at a time: two independent chains of conversions and operations.
  for (; i + 16 <= n; i += 16) {
    __m256 a = load(input(0) + i);
    __m256 b = load(input(0) + i + 8);
    for (size_t r = 1; r < count; ++r) {
      a = Vec::apply(a, load(input(r) + i));
      b = Vec::apply(b, load(input(r) + i + 8));
    }
    finish(a, o + i);
    finish(b, o + i + 8);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = load(input(0) + i);
    for (size_t r = 1; r < count; ++r) a = Vec::apply(a, load(input(r) + i));
    finish(a, o + i);
  }
  for (; i < n; ++i) {
    float acc = Type::load(input(0)[i]);
    for (size_t r = 1; r < count; ++r) acc = Op()(acc, Type::load(input(r)[i]));
    if (divisor > 0) acc = power_of_two ? acc * (1.0f / div) : acc / div;
    o[i] = Type::store(acc);
  }
}

template <typename Conv>
ReduceFn half_pick(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &half_reduce_loop<Conv, VecSum, SumOp>;
    case ReduceOp::kProd:
      return &half_reduce_loop<Conv, VecProd, ProdOp>;
    case ReduceOp::kMin:
      return &half_reduce_loop<Conv, VecMin, MinOp>;
    case ReduceOp::kMax:
      return &half_reduce_loop<Conv, VecMax, MaxOp>;
  }
  return nullptr;
}

template <typename Conv>
void half_reduce_all(ReduceOp op, const void* const* in, size_t count, void* out, size_t n,
                     int divisor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return half_reduce_all_loop<Conv, VecSum, SumOp>(in, count, out, n, divisor);
    case ReduceOp::kProd:
      return half_reduce_all_loop<Conv, VecProd, ProdOp>(in, count, out, n, divisor);
    case ReduceOp::kMin:
      return half_reduce_all_loop<Conv, VecMin, MinOp>(in, count, out, n, divisor);
    case ReduceOp::kMax:
      return half_reduce_all_loop<Conv, VecMax, MaxOp>(in, count, out, n, divisor);
  }
}

}  // namespace RR_KERNEL_VARIANT
}  // namespace rr
#define RR_HAVE_F16C_KERNELS 1
#endif
