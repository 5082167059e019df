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
void variant_reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                        size_t n, int divisor);
}  // namespace generic

#if defined(RR_HAVE_AVX2_KERNELS)
namespace avx2 {
ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op);
void variant_divide(DataType dtype, void* data, size_t n, int divisor);
bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor);
void variant_reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                        size_t n, int divisor);
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

void reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                size_t n, int divisor) {
#if defined(RR_HAVE_AVX2_KERNELS)
  if (use_avx2()) return avx2::variant_reduce_all(dtype, op, in, count, out, n, divisor);
#endif
  generic::variant_reduce_all(dtype, op, in, count, out, n, divisor);
}

#if defined(__x86_64__)
namespace {

// One add per element as the sum kernel's, in a + b order, so the bits are its
// bits. AVX's streaming stores write a cache line in two stores and need
// 32-byte aligned addresses: the elements before the first aligned one, and
// the tail, are written plainly.
template <typename T>
__attribute__((target("avx"))) void stream_sum(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  constexpr size_t kLanes = 32 / sizeof(T);
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(o + i) % 32) != 0; ++i) o[i] = x[i] + y[i];
  for (; i + kLanes <= n; i += kLanes) {
    if constexpr (sizeof(T) == 4) {
      _mm256_stream_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    } else {
      _mm256_stream_pd(o + i, _mm256_add_pd(_mm256_loadu_pd(x + i), _mm256_loadu_pd(y + i)));
    }
  }
  for (; i < n; ++i) o[i] = x[i] + y[i];
  _mm_sfence();
}

}  // namespace

// Without AVX (x86-64 CPUs before 2011) the plain kernels stay.
ReduceFn cpu_stream_sum_fn(DataType dtype) {
  static const bool avx = __builtin_cpu_supports("avx");
  if (!avx) return nullptr;
  if (dtype == DataType::kFloat32) return &stream_sum<float>;
  if (dtype == DataType::kFloat64) return &stream_sum<double>;
  return nullptr;
}
#else
ReduceFn cpu_stream_sum_fn(DataType) { return nullptr; }
#endif

const char* cpu_kernel_isa() { return use_avx2() ? "avx2" : "generic"; }

}  // namespace rr
