// CUDA kernels for the codecs of compressed all-reduce: the device-side
// counterpart of codec.h, for device arrays, giving the same payload bytes and
// the same decoded bits as the CPU loops (so a rank on a GPU and a rank on the
// CPU encode alike, and every rank ends with the same bits).
//
// One CUDA block per codec block (kBlock = 512 values, 256 threads, two values
// each): the block's range is a shared-memory integer maximum, then every
// value is encoded on its own (the dither is a hash of the value's index). The
// arithmetic is the CPU loops', in the same order, with explicitly rounded
// operations (__fmul_rn, __fadd_rn, __fdiv_rn), which nvcc never fuses into
// a multiply-add, and with x86's NaN rules (a GPU has one canonical NaN), so a
// NaN keeps the CPU's bits too.
//
// Every function enqueues on `stream` and returns the launch status; every
// pointer is device memory (or memory the device can address). Only built with
// CUDA (cmake/cuda.cmake).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/codec.h"

namespace rr {
namespace codec {

// payload = encode(x + residual) (residual may be null); with a residual,
// residual = what the encode dropped. residual_out_only: encodes x alone and
// writes what it dropped into residual. `first`: x[0]'s index in the array x
// is a piece of (codec.h's encode).
cudaError_t cuda_encode(CodecKind kind, const float* x, float* residual, bool residual_out_only,
                        size_t n, uint64_t key, uint8_t* payload, cudaStream_t stream,
                        uint64_t first = 0);

// out[0, n) = the values of payload.
cudaError_t cuda_decode(CodecKind kind, const uint8_t* payload, size_t n, float* out,
                        cudaStream_t stream);

// acc[i] += the values of payloads + j * stride, for j = 0 .. count-1 in order.
cudaError_t cuda_decode_add(CodecKind kind, const uint8_t* payloads, size_t stride, size_t count,
                            size_t n, float* acc, cudaStream_t stream);

// dst = src, float32 to or from float16 or bfloat16 (numpy's and ml_dtypes'
// rounding, nan included); cudaErrorInvalidValue for other pairs.
cudaError_t cuda_convert(DataType to, void* dst, DataType from, const void* src, size_t n,
                         cudaStream_t stream);

}  // namespace codec
}  // namespace rr
