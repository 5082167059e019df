// CPU reduction kernels: a (dtype x op) table of type-erased functions.
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace rr {

// out[i] = a[i] op b[i] for i < n. `out` may alias `a` or `b`.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for (dtype, op). kAvg maps to the sum kernel: the division by the
// number of ranks happens once, in divide_by().
ReduceFn cpu_reduce_fn(DataType dtype, ReduceOp op);

// data[i] /= divisor, in the dtype's compute type (floating types only).
void divide_by(DataType dtype, void* data, size_t n, int divisor);

// out[i] = (a[i] + b[i]) / divisor in one pass, with the bits of the sum
// kernel followed by divide_by (avg's last reduce-scatter step). False, and
// nothing done, for a dtype without such a kernel (16-bit floats).
bool sum_divide(DataType dtype, void* out, const void* a, const void* b, size_t n, int divisor);

// out[i] = in[0][i] op in[1][i] op ... op in[count-1][i] (count >= 1), in
// that order, in the dtype's compute type and rounded to the dtype once, then
// divided by `divisor` in the compute type when it is > 0 (avg). Where one
// place reads every rank's input (the window paths), float16 and bfloat16 so
// accumulate in float32 instead of rounding at every addition as a ring's hops
// must; for every other dtype the compute type is the dtype and the bits are
// the pairwise kernels' in rank order. `out` may be one of the inputs.
void reduce_all(DataType dtype, ReduceOp op, const void* const* in, size_t count, void* out,
                size_t n, int divisor);

// out[i] = a[i] + b[i], the sum kernel's bits, with `out` written by
// streaming (non-temporal) stores: they skip reading out's lines into the
// cache before overwriting them, which pays for an output too large to be
// read again from the cache. The stores are fenced before it returns, so a
// peer told afterwards sees them. `out` must not overlap a or b. Null for a
// dtype or CPU without one (float32 and float64 have one on x86-64 with AVX).
ReduceFn cpu_stream_sum_fn(DataType dtype);

// Which instruction set the kernels run with on this CPU ("avx2" or "generic").
const char* cpu_kernel_isa();

}  // namespace rr
