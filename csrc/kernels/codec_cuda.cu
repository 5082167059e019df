// The launches of the codec kernels (codec_cuda.h); the kernels themselves are
// in codec_cuda_kernels.cuh.
#include <cstdint>

#include "kernels/codec_cuda.h"
#include "kernels/codec_cuda_kernels.cuh"

namespace rr {
namespace codec {

using namespace kernels;

namespace {

unsigned grid_of(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

cudaError_t cuda_encode(CodecKind kind, const float* x, float* residual, bool residual_out_only,
                        size_t n, uint64_t key, uint8_t* payload, cudaStream_t stream,
                        uint64_t first) {
  if (n == 0) return cudaSuccess;
  const size_t nb = (n + kBlock - 1) / kBlock;
  encode_kernel<<<static_cast<unsigned>(nb), kThreads, 0, stream>>>(
      kind, x, residual, residual_out_only, n, key, payload, first);
  return cudaGetLastError();
}

cudaError_t cuda_decode(CodecKind kind, const uint8_t* payload, size_t n, float* out,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t nb = (n + kBlock - 1) / kBlock;
  decode_kernel<<<static_cast<unsigned>(nb), kThreads, 0, stream>>>(kind, payload, 0, 1, n, out,
                                                                    false);
  return cudaGetLastError();
}

cudaError_t cuda_decode_add(CodecKind kind, const uint8_t* payloads, size_t stride, size_t count,
                            size_t n, float* acc, cudaStream_t stream) {
  if (n == 0 || count == 0) return cudaSuccess;
  const size_t nb = (n + kBlock - 1) / kBlock;
  decode_kernel<<<static_cast<unsigned>(nb), kThreads, 0, stream>>>(kind, payloads, stride, count,
                                                                    n, acc, true);
  return cudaGetLastError();
}

cudaError_t cuda_convert(DataType to, void* dst, DataType from, const void* src, size_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool widen = to == DataType::kFloat32;
  const DataType half = widen ? from : to;
  if (half != DataType::kFloat16 && half != DataType::kBFloat16) return cudaErrorInvalidValue;
  if (!widen && from != DataType::kFloat32) return cudaErrorInvalidValue;
  const bool bf16 = half == DataType::kBFloat16;
  if (widen) {
    convert_kernel<<<grid_of(n), kThreads, 0, stream>>>(
        n, Widen{static_cast<const uint16_t*>(src), static_cast<float*>(dst), bf16});
  } else {
    convert_kernel<<<grid_of(n), kThreads, 0, stream>>>(
        n, Narrow{static_cast<const float*>(src), static_cast<uint16_t*>(dst), bf16});
  }
  return cudaGetLastError();
}

}  // namespace codec
}  // namespace rr
