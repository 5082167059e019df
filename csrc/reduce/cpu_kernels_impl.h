// The kernel bodies, compiled once per instruction-set variant (see
// CMakeLists.txt); each variant lives in its own namespace RR_KERNEL_VARIANT.
#pragma once

#include <cstddef>

#include "common/dtype.h"
#include "reduce/cpu_kernels.h"
#include "reduce/f16c_kernels.h"
#include "reduce/ops.h"

namespace rr {
namespace RR_KERNEL_VARIANT {

// __restrict__ is not claimed: out may alias a. GCC still vectorizes these
// loops, with a runtime overlap check.
template <typename Type, typename Op>
void reduce_loop(void* out, const void* a, const void* b, size_t n) {
  using S = typename Type::storage;
  S* o = static_cast<S*>(out);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = apply<Type, Op>(x[i], y[i]);
}

template <typename Type>
void divide_loop(void* data, size_t n, int divisor) {
  using S = typename Type::storage;
  using C = typename Type::compute;
  S* d = static_cast<S*>(data);
  const C div = static_cast<C>(divisor);
  if (divisor > 0 && (divisor & (divisor - 1)) == 0) {
    // x / 2^k and x * 2^-k are the same real number, so they round to the same
    // bits (subnormals, infinities and NaN included), and a multiply costs a
    // fraction of a divide.
    const C inverse = C(1) / div;
    for (size_t i = 0; i < n; ++i) d[i] = Type::store(Type::load(d[i]) * inverse);
    return;
  }
  for (size_t i = 0; i < n; ++i) d[i] = Type::store(Type::load(d[i]) / div);
}

// out = (a + b) / divisor in one pass, for plain float types: the sum rounds
// to the type, then the quotient does, as the sum kernel and then
// divide_loop would (avg's last reduce-scatter step).
template <typename Type>
void sum_divide_loop(void* out, const void* a, const void* b, size_t n, int divisor) {
  using S = typename Type::storage;
  S* o = static_cast<S*>(out);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  const S div = static_cast<S>(divisor);
  if (divisor > 0 && (divisor & (divisor - 1)) == 0) {
    const S inverse = S(1) / div;  // exact: see divide_loop
    for (size_t i = 0; i < n; ++i) o[i] = (x[i] + y[i]) * inverse;
    return;
  }
  for (size_t i = 0; i < n; ++i) o[i] = (x[i] + y[i]) / div;
}

inline bool fused_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                             int divisor) {
  switch (dtype) {
    case DataType::kFloat32: sum_divide_loop<Float32Type>(out, a, b, n, divisor); return true;
    case DataType::kFloat64: sum_divide_loop<Float64Type>(out, a, b, n, divisor); return true;
    default: return false;
  }
}

template <typename Type>
ReduceFn pick_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &reduce_loop<Type, SumOp>;
    case ReduceOp::kProd: return &reduce_loop<Type, ProdOp>;
    case ReduceOp::kMin: return &reduce_loop<Type, MinOp>;
    case ReduceOp::kMax: return &reduce_loop<Type, MaxOp>;
  }
  return nullptr;
}

inline ReduceFn reduce_fn(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat16:
#if defined(RR_HAVE_F16C_KERNELS)
      return f16c_pick(op);
#else
      return pick_op<Float16Type>(op);
#endif
    case DataType::kBFloat16: return pick_op<BFloat16Type>(op);
    case DataType::kFloat32: return pick_op<Float32Type>(op);
    case DataType::kFloat64: return pick_op<Float64Type>(op);
    case DataType::kInt8: return pick_op<Int8Type>(op);
    case DataType::kUInt8: return pick_op<UInt8Type>(op);
    case DataType::kInt32: return pick_op<Int32Type>(op);
    case DataType::kInt64: return pick_op<Int64Type>(op);
  }
  return nullptr;
}

inline void divide(DataType dtype, void* data, size_t n, int divisor) {
  switch (dtype) {
    case DataType::kFloat16: return divide_loop<Float16Type>(data, n, divisor);
    case DataType::kBFloat16: return divide_loop<BFloat16Type>(data, n, divisor);
    case DataType::kFloat32: return divide_loop<Float32Type>(data, n, divisor);
    case DataType::kFloat64: return divide_loop<Float64Type>(data, n, divisor);
    default: return;
  }
}

// Explicit entry points, defined in cpu_kernels_<variant>.cc.
ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op);
void variant_divide(DataType dtype, void* data, size_t n, int divisor);
bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor);

}  // namespace RR_KERNEL_VARIANT
}  // namespace rr
