// Instantiates the kernels for one instruction-set variant. CMake compiles this
// file several times with different -m flags and RR_KERNEL_VARIANT names.
#include "reduce/cpu_kernels_impl.h"

namespace rr {
namespace RR_KERNEL_VARIANT {

ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op) { return reduce_fn(dtype, op); }

void variant_divide(DataType dtype, void* data, size_t n, int divisor) {
  divide(dtype, data, n, divisor);
}

bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor) {
  return fused_sum_divide(dtype, out, a, b, n, divisor);
}

void variant_reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                        size_t n, int divisor) {
  reduce_all_dtype(dtype, op, in, count, out, n, divisor);
}

}  // namespace RR_KERNEL_VARIANT
}  // namespace rr
