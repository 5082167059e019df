// float16 kernels with the F16C conversion instructions, for the AVX2 variant.
//
// GCC does not vectorize the portable bit-twiddling conversions in half.h, so
// float16 would run scalar. vcvtph2ps/vcvtps2ph convert exactly like half.h
// (IEEE round to nearest even, subnormals kept, NaN quieted), and the vector
// min/max below reproduce MinOp/MaxOp including NaN propagation and the
// choice between -0 and +0; the scalar tail uses the shared functors.
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

template <typename Vec, typename Op>
void f16c_reduce_loop(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    __m128i r = _mm256_cvtps_ph(Vec::apply(va, vb), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), r);
  }
  for (; i < n; ++i) o[i] = apply<Float16Type, Op>(x[i], y[i]);
}

// reduce_all_loop for float16 (cpu_kernels_impl.h): every input of 8
// elements converted and combined in registers, in rank order, then divided
// (a multiply by the exact inverse for a power of two, as divide_loop does)
// and rounded once.
template <typename Vec, typename Op>
void f16c_reduce_all_loop(const void* const* in, size_t count, void* out, size_t n, int divisor) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const auto input = [in](size_t r) { return static_cast<const uint16_t*>(in[r]); };
  const bool power_of_two = divisor > 0 && (divisor & (divisor - 1)) == 0;
  const float div = static_cast<float>(divisor > 0 ? divisor : 1);
  const __m256 vdiv = _mm256_set1_ps(div);
  const __m256 inverse = _mm256_set1_ps(1.0f / div);
  const auto load = [](const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  const auto finish = [&](__m256 acc, uint16_t* to) {
    if (divisor > 0) acc = power_of_two ? _mm256_mul_ps(acc, inverse) : _mm256_div_ps(acc, vdiv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to),
                     _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
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
    float acc = Float16Type::load(input(0)[i]);
    for (size_t r = 1; r < count; ++r) acc = Op()(acc, Float16Type::load(input(r)[i]));
    if (divisor > 0) acc = power_of_two ? acc * (1.0f / div) : acc / div;
    o[i] = Float16Type::store(acc);
  }
}

inline ReduceFn f16c_pick(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &f16c_reduce_loop<VecSum, SumOp>;
    case ReduceOp::kProd:
      return &f16c_reduce_loop<VecProd, ProdOp>;
    case ReduceOp::kMin:
      return &f16c_reduce_loop<VecMin, MinOp>;
    case ReduceOp::kMax:
      return &f16c_reduce_loop<VecMax, MaxOp>;
  }
  return nullptr;
}

inline void f16c_reduce_all(ReduceOp op, const void* const* in, size_t count, void* out, size_t n,
                            int divisor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return f16c_reduce_all_loop<VecSum, SumOp>(in, count, out, n, divisor);
    case ReduceOp::kProd:
      return f16c_reduce_all_loop<VecProd, ProdOp>(in, count, out, n, divisor);
    case ReduceOp::kMin:
      return f16c_reduce_all_loop<VecMin, MinOp>(in, count, out, n, divisor);
    case ReduceOp::kMax:
      return f16c_reduce_all_loop<VecMax, MaxOp>(in, count, out, n, divisor);
  }
}

}  // namespace RR_KERNEL_VARIANT
}  // namespace rr
#define RR_HAVE_F16C_KERNELS 1
#endif
