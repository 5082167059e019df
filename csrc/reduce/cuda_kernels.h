// CUDA reduction kernels: the device-side counterpart of cpu_kernels.h, for the
// same (dtype x op) table and with the same per-element functors (ops.h), so a
// reduction gives the same bits on the GPU as on the CPU.
//
// Only built when CMake finds a CUDA compiler (RR_WITH_CUDA in config.h). The
// CUDA runtime is linked statically, so every call here works, or fails with a
// cudaError_t, on machines with no GPU and no driver.
//
// Device selection: like any CUDA runtime call, the launches run on the calling
// thread's current device of this library's own (static) runtime, which is not
// the device that torch or cupy made current. Callers pick it with
// cudaSetDevice(), for example from cuda_pointer_device().
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"

namespace rr {

// Enqueues out[i] = a[i] op b[i] for i < n on `stream` and returns the launch
// status (kernel faults surface later, on the stream). `out` may be `a` or `b`
// but must not partially overlap them. kAvg runs the sum kernel: the division by
// the number of ranks happens once, in cuda_divide(). When out, a and b are all
// 16-byte aligned the kernel moves 16 bytes per load and store.
cudaError_t cuda_reduce(DataType dtype, ReduceOp op, void* out, const void* a, const void* b,
                        size_t n, cudaStream_t stream);

// The most inputs, and the most outputs, one cuda_reduce_all() takes: their
// addresses travel in the kernel's arguments.
constexpr int kMaxAllSpans = 16;

// Enqueues, for i < n, v = in[0][i] op ... op in[count-1][i] in rank order in
// the compute type (float32 for the 16-bit floats), divided by `divisor` when
// it is > 0 (avg), rounded to the dtype once and written into out[0..outputs)[i]:
// one kernel, reduce_all()'s bits (reduce/cpu_kernels.h). An output may be an
// input; any address may be a peer's memory mapped here. 1 <= count <= kMaxAllSpans
// and outputs <= kMaxAllSpans, else cudaErrorInvalidValue.
cudaError_t cuda_reduce_all(DataType dtype, ReduceOp op, const void* const* in, int count,
                            void* const* out, int outputs, size_t n, int divisor,
                            cudaStream_t stream);

// Enqueues data[i] /= divisor in the dtype's compute type on `stream`. Floating
// dtypes only: integers return cudaErrorInvalidValue, as there is no integer
// average.
cudaError_t cuda_divide(DataType dtype, void* data, size_t n, int divisor, cudaStream_t stream);

// The number of usable CUDA devices: 0, not an error, when there is no GPU or
// no driver.
int cuda_device_count();

// The device that owns `ptr` (device or managed memory); cudaErrorInvalidValue
// for host memory.
cudaError_t cuda_pointer_device(const void* ptr, int* device);

}  // namespace rr
