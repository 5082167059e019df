// The kernel bodies, compiled once per instruction-set variant (see
// CMakeLists.txt); each variant lives in its own namespace RR_KERNEL_VARIANT.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

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
    case DataType::kFloat32:
      sum_divide_loop<Float32Type>(out, a, b, n, divisor);
      return true;
    case DataType::kFloat64:
      sum_divide_loop<Float64Type>(out, a, b, n, divisor);
      return true;
    default:
      return false;
  }
}

// The elements reduce_all_loop takes at a time: its accumulator lives on the
// stack (8 KiB in float64) and in L1, and the output is written only once a
// block of every input has been read, so the output may be one of the inputs.
constexpr size_t kAllBlock = 1024;

// A block of values as the dtype's compute type and back.
template <typename Type>
void widen(typename Type::compute* to, const typename Type::storage* from, size_t n) {
  for (size_t i = 0; i < n; ++i) to[i] = Type::load(from[i]);
}

template <typename Type>
void narrow(typename Type::storage* to, const typename Type::compute* from, size_t n) {
  for (size_t i = 0; i < n; ++i) to[i] = Type::store(from[i]);
}

// out = in[0] op in[1] op ... op in[count-1], in that order, in the compute
// type, rounded to the dtype once (then divided, for divisor > 0): see
// reduce_all() in cpu_kernels.h.
template <typename Type, typename Op>
void reduce_all_loop(const void* const* in, size_t count, void* out, size_t n, int divisor) {
  using S = typename Type::storage;
  using C = typename Type::compute;
  if constexpr (std::is_same_v<S, C>) {
    if (count == 2) {
      // One pass of the pairwise kernel, straight into out (which may be either
      // input: each element is read before it is written), then the division:
      // the same arithmetic without the block's extra copy.
      reduce_loop<Type, Op>(out, in[0], in[1], n);
      if (divisor > 0) divide_loop<Type>(out, n, divisor);
      return;
    }
  }
  C acc[kAllBlock];
  S* o = static_cast<S*>(out);
  const C div = static_cast<C>(divisor > 0 ? divisor : 1);
  const bool power_of_two = divisor > 0 && (divisor & (divisor - 1)) == 0;
  const C inverse = C(1) / div;  // exact where used: see divide_loop
  for (size_t at = 0; at < n; at += kAllBlock) {
    const size_t m = std::min(kAllBlock, n - at);
    const auto* x = static_cast<const S*>(in[0]) + at;
    if constexpr (std::is_same_v<S, C>) {
      // The inputs are already in the compute type: combined straight from them.
      const auto* y = count > 1 ? static_cast<const S*>(in[1]) + at : nullptr;
      if (y != nullptr) {
        for (size_t i = 0; i < m; ++i) acc[i] = Op()(x[i], y[i]);
      } else {
        std::copy(x, x + m, acc);
      }
      for (size_t r = 2; r < count; ++r) {
        const auto* z = static_cast<const S*>(in[r]) + at;
        for (size_t i = 0; i < m; ++i) acc[i] = Op()(acc[i], z[i]);
      }
    } else {
      C next[kAllBlock];
      widen<Type>(acc, x, m);
      for (size_t r = 1; r < count; ++r) {
        widen<Type>(next, static_cast<const S*>(in[r]) + at, m);
        for (size_t i = 0; i < m; ++i) acc[i] = Op()(acc[i], next[i]);
      }
    }
    if (divisor > 0) {
      if (power_of_two) {
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] * inverse;
      } else {
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] / div;
      }
    }
    narrow<Type>(o + at, acc, m);
  }
}

template <typename Type>
void reduce_all_typed(ReduceOp op, const void* const* in, size_t count, void* out, size_t n,
                      int divisor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduce_all_loop<Type, SumOp>(in, count, out, n, divisor);
    case ReduceOp::kProd:
      return reduce_all_loop<Type, ProdOp>(in, count, out, n, divisor);
    case ReduceOp::kMin:
      return reduce_all_loop<Type, MinOp>(in, count, out, n, divisor);
    case ReduceOp::kMax:
      return reduce_all_loop<Type, MaxOp>(in, count, out, n, divisor);
  }
}

inline void reduce_all_dtype(DataType dtype, ReduceOp op, const void* const* in, size_t count,
                             void* out, size_t n, int divisor) {
  switch (dtype) {
#if defined(RR_HAVE_F16C_KERNELS)
    case DataType::kFloat16:
      return half_reduce_all<F16>(op, in, count, out, n, divisor);
    case DataType::kBFloat16:
      return half_reduce_all<Bf16>(op, in, count, out, n, divisor);
#else
    case DataType::kFloat16:
      return reduce_all_typed<Float16Type>(op, in, count, out, n, divisor);
    case DataType::kBFloat16:
      return reduce_all_typed<BFloat16Type>(op, in, count, out, n, divisor);
#endif
    case DataType::kFloat32:
      return reduce_all_typed<Float32Type>(op, in, count, out, n, divisor);
    case DataType::kFloat64:
      return reduce_all_typed<Float64Type>(op, in, count, out, n, divisor);
    case DataType::kInt8:
      return reduce_all_typed<Int8Type>(op, in, count, out, n, divisor);
    case DataType::kUInt8:
      return reduce_all_typed<UInt8Type>(op, in, count, out, n, divisor);
    case DataType::kInt32:
      return reduce_all_typed<Int32Type>(op, in, count, out, n, divisor);
    case DataType::kInt64:
      return reduce_all_typed<Int64Type>(op, in, count, out, n, divisor);
  }
}

template <typename Type>
ReduceFn pick_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &reduce_loop<Type, SumOp>;
    case ReduceOp::kProd:
      return &reduce_loop<Type, ProdOp>;
    case ReduceOp::kMin:
      return &reduce_loop<Type, MinOp>;
    case ReduceOp::kMax:
      return &reduce_loop<Type, MaxOp>;
  }
  return nullptr;
}

inline ReduceFn reduce_fn(DataType dtype, ReduceOp op) {
  switch (dtype) {
#if defined(RR_HAVE_F16C_KERNELS)
    case DataType::kFloat16:
      return half_pick<F16>(op);
    case DataType::kBFloat16:
      return half_pick<Bf16>(op);
#else
    case DataType::kFloat16:
      return pick_op<Float16Type>(op);
    case DataType::kBFloat16:
      return pick_op<BFloat16Type>(op);
#endif
    case DataType::kFloat32:
      return pick_op<Float32Type>(op);
    case DataType::kFloat64:
      return pick_op<Float64Type>(op);
    case DataType::kInt8:
      return pick_op<Int8Type>(op);
    case DataType::kUInt8:
      return pick_op<UInt8Type>(op);
    case DataType::kInt32:
      return pick_op<Int32Type>(op);
    case DataType::kInt64:
      return pick_op<Int64Type>(op);
  }
  return nullptr;
}

inline void divide(DataType dtype, void* data, size_t n, int divisor) {
  switch (dtype) {
    case DataType::kFloat16:
      return divide_loop<Float16Type>(data, n, divisor);
    case DataType::kBFloat16:
      return divide_loop<BFloat16Type>(data, n, divisor);
    case DataType::kFloat32:
      return divide_loop<Float32Type>(data, n, divisor);
    case DataType::kFloat64:
      return divide_loop<Float64Type>(data, n, divisor);
    default:
      return;
  }
}

// Explicit entry points, defined in cpu_kernels_<variant>.cc.
ReduceFn variant_reduce_fn(DataType dtype, ReduceOp op);
void variant_divide(DataType dtype, void* data, size_t n, int divisor);
bool variant_sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n,
                        int divisor);
void variant_reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                        size_t n, int divisor);

}  // namespace RR_KERNEL_VARIANT
}  // namespace rr
