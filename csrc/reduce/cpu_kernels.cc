// Runtime dispatch between the kernel variants: the AVX2 build where the CPU
// has it (x86-64 only), the baseline build everywhere else.
#include "reduce/cpu_kernels.h"

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rr {
namespace generic {
ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op);
void variant_divide(DataType dtype, void* data, size_t n, int divisor);
bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor);
}  // namespace generic

#if defined(RR_HAVE_AVX2_KERNELS)
namespace avx2 {
ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op);
void variant_divide(DataType dtype, void* data, size_t n, int divisor);
bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor);
}  // namespace avx2

static bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#else
static bool use_avx2() { return false; }
#endif

ReduceFn cpu_reduce_fn(DataType dtype, ReduceOp op) {
#if defined(RR_HAVE_AVX2_KERNELS)
  if (use_avx2()) return avx2::variant_reduce_fn(dtype, op);
#endif
  return generic::variant_reduce_fn(dtype, op);
}

void divide_by(DataType dtype, void* data, size_t n, int divisor) {
#if defined(RR_HAVE_AVX2_KERNELS)
  if (use_avx2()) return avx2::variant_divide(dtype, data, n, divisor);
#endif
  generic::variant_divide(dtype, data, n, divisor);
}

bool sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n, int divisor) {
#if defined(RR_HAVE_AVX2_KERNELS)
  if (use_avx2()) return avx2::variant_sum_divide(dtype, out, a, b, n, divisor);
#endif
  return generic::variant_sum_divide(dtype, out, a, b, n, divisor);
}

#if defined(__x86_64__)
namespace {

// One add per element as the sum kernel's, in a + b order, so the bits are its
// bits. Streaming stores need aligned addresses (16 bytes for SSE2, which every
// x86-64 has; 32 for AVX, which writes a cache line in two stores instead of
// four), so the elements before the first aligned one are written plainly.
template <typename T, size_t kAlign, typename Body>
inline void stream_sum(T* o, const T* x, const T* y, size_t n, Body vector_body) {
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(o + i) % kAlign) != 0; ++i) o[i] = x[i] + y[i];
  i = vector_body(o, x, y, i, n);
  for (; i < n; ++i) o[i] = x[i] + y[i];
  _mm_sfence();
}

void stream_sum_f32_sse2(void* out, const void* a, const void* b, size_t n) {
  stream_sum<float, 16>(
      static_cast<float*>(out), static_cast<const float*>(a), static_cast<const float*>(b), n,
      [](float* o, const float* x, const float* y, size_t i, size_t end) {
        for (; i + 4 <= end; i += 4) {
          _mm_stream_ps(o + i, _mm_add_ps(_mm_loadu_ps(x + i), _mm_loadu_ps(y + i)));
        }
        return i;
      });
}

void stream_sum_f64_sse2(void* out, const void* a, const void* b, size_t n) {
  stream_sum<double, 16>(
      static_cast<double*>(out), static_cast<const double*>(a), static_cast<const double*>(b), n,
      [](double* o, const double* x, const double* y, size_t i, size_t end) {
        for (; i + 2 <= end; i += 2) {
          _mm_stream_pd(o + i, _mm_add_pd(_mm_loadu_pd(x + i), _mm_loadu_pd(y + i)));
        }
        return i;
      });
}

__attribute__((target("avx"))) size_t stream_body_f32_avx(float* o, const float* x, const float* y,
                                                          size_t i, size_t end) {
  for (; i + 8 <= end; i += 8) {
    _mm256_stream_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  return i;
}

__attribute__((target("avx"))) size_t stream_body_f64_avx(double* o, const double* x,
                                                          const double* y, size_t i, size_t end) {
  for (; i + 4 <= end; i += 4) {
    _mm256_stream_pd(o + i, _mm256_add_pd(_mm256_loadu_pd(x + i), _mm256_loadu_pd(y + i)));
  }
  return i;
}

void stream_sum_f32_avx(void* out, const void* a, const void* b, size_t n) {
  stream_sum<float, 32>(static_cast<float*>(out), static_cast<const float*>(a),
                        static_cast<const float*>(b), n, &stream_body_f32_avx);
}

void stream_sum_f64_avx(void* out, const void* a, const void* b, size_t n) {
  stream_sum<double, 32>(static_cast<double*>(out), static_cast<const double*>(a),
                         static_cast<const double*>(b), n, &stream_body_f64_avx);
}

}  // namespace

ReduceFn cpu_stream_sum_fn(DataType dtype) {
  static const bool avx = __builtin_cpu_supports("avx");
  if (dtype == DataType::kFloat32) return avx ? &stream_sum_f32_avx : &stream_sum_f32_sse2;
  if (dtype == DataType::kFloat64) return avx ? &stream_sum_f64_avx : &stream_sum_f64_sse2;
  return nullptr;
}
#else
ReduceFn cpu_stream_sum_fn(DataType) { return nullptr; }
#endif

const char* cpu_kernel_isa() { return use_avx2() ? "avx2" : "generic"; }

}  // namespace rr
