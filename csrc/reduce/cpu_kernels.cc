// Runtime dispatch between the kernel variants: the AVX2 build where the CPU
// has it (x86-64 only), the baseline build everywhere else.
#include "reduce/cpu_kernels.h"

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

const char* cpu_kernel_isa() { return use_avx2() ? "avx2" : "generic"; }

}  // namespace rr
