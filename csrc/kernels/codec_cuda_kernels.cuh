// The codec kernels' device code (codec_cuda.h), apart from their launches
// (codec_cuda.cu), so that tests/codec_cuda_emulation.cc can compile the very
// same code for the CPU, CUDA threads as host threads, and compare its bytes with
// the CPU loops' on a machine without a GPU. Terms are codec_impl.h's: a block is
// kBlock values sharing one scale; a payload holds the nb scales (scaled codecs),
// then the codes, block after block (int4: two per byte, the first in the low
// nibble). Each kernel handles one block per CUDA block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/codec.h"
#include "kernels/codec_scalar.h"
#include "kernels/dither.h"
#include "reduce/half.h"

namespace rr {
namespace codec {
namespace kernels {

constexpr int kThreads = 256;
constexpr int kPerThread = kBlock / kThreads;  // values per thread: 2
static_assert(kPerThread * kThreads == kBlock, "a block is a whole number of thread rows");

// float arithmetic with x86's NaN rules, so that NaNs come out with the CPU loops'
// bits (a GPU returns one canonical NaN): a NaN operand comes back quieted, the
// first if both are; an invalid operation on numbers (inf - inf, 0 * inf) gives
// x86's default NaN, 0xffc00000.
__device__ __forceinline__ float nan_of(float a, float b) {
  if (isnan(a)) return bits_float(float_bits(a) | 0x00400000u);
  if (isnan(b)) return bits_float(float_bits(b) | 0x00400000u);
  return bits_float(0xffc00000u);
}
__device__ __forceinline__ float add(float a, float b) {
  const float r = __fadd_rn(a, b);
  return isnan(r) ? nan_of(a, b) : r;
}
__device__ __forceinline__ float sub(float a, float b) {
  const float r = __fsub_rn(a, b);
  return isnan(r) ? nan_of(a, b) : r;
}
__device__ __forceinline__ float mul(float a, float b) {
  const float r = __fmul_rn(a, b);
  return isnan(r) ? nan_of(a, b) : r;
}

__device__ __forceinline__ size_t blocks_of(size_t n) { return (n + kBlock - 1) / kBlock; }

__device__ __forceinline__ bool scaled(CodecKind kind) { return kind != CodecKind::kBFloat16; }

__device__ __forceinline__ int qmax_of(CodecKind kind) {
  return kind == CodecKind::kInt4 ? 7 : 127;
}

// Bytes of the codes of m values (codec_impl.h's code_bytes).
__device__ __forceinline__ size_t code_bytes(CodecKind kind, size_t m) {
  switch (kind) {
    case CodecKind::kBFloat16:
    case CodecKind::kFloat16:
      return 2 * m;
    case CodecKind::kInt8:
      return m;
    case CodecKind::kInt4:
      return (m * 4 + 7) / 8;
  }
  return 0;
}

// Where block b's codes start in a payload of nb blocks.
__device__ __forceinline__ size_t codes_offset(CodecKind kind, size_t nb, size_t b) {
  return (scaled(kind) ? 4 * nb : 0) + code_bytes(kind, b * kBlock);
}

// The value of code c (already sign-extended for the integers) in a block of
// scale `scale` (negative: the block held inf or nan), as codec_impl.h decodes.
__device__ __forceinline__ float decode_one(CodecKind kind, int32_t c, float scale) {
  switch (kind) {
    case CodecKind::kBFloat16:
      return bits_float(static_cast<uint32_t>(c & 0xffff) << 16);
    case CodecKind::kFloat16:
      return mul(half_to_float(static_cast<uint16_t>(c)), scale);
    default: {
      const float v = mul(static_cast<float>(c), fabsf(scale));
      if (!signbit(scale)) return v;
      const int q = qmax_of(kind);
      if (c == q) return bits_float(0x7f800000u);
      if (c == -q) return bits_float(0xff800000u);
      if (c == -q - 1) return bits_float(0x7fc00000u);
      return v;
    }
  }
}

// Code i of a block whose codes start at `codes` (int4 sign-extended).
__device__ __forceinline__ int32_t load_code(CodecKind kind, const uint8_t* codes, size_t i) {
  switch (kind) {
    case CodecKind::kBFloat16:
    case CodecKind::kFloat16: {
      uint16_t h;
      memcpy(&h, codes + 2 * i, 2);  // payload scales come first: codes are 2-byte aligned only
      return h;
    }
    case CodecKind::kInt8:
      return static_cast<int8_t>(codes[i]);
    case CodecKind::kInt4: {
      const int nibble = (i % 2) ? codes[i / 2] >> 4 : codes[i / 2] & 0x0f;
      return (nibble ^ 8) - 8;
    }
  }
  return 0;
}

__device__ __forceinline__ float scale_of(CodecKind kind, const uint8_t* payload, size_t b) {
  float scale = 0.0f;
  if (scaled(kind)) memcpy(&scale, payload + 4 * b, 4);
  return scale;
}

__global__ void __launch_bounds__(kThreads)
    encode_kernel(CodecKind kind, const float* x, float* residual, bool residual_out_only, size_t n,
                  uint64_t key, uint8_t* payload, uint64_t first) {
  __shared__ int top_bits, any_bits;
  __shared__ int8_t small[kBlock];  // the integer codes, packed by pairs afterwards
  const size_t nb = blocks_of(n);
  const size_t b = blockIdx.x;
  const size_t lo = b * kBlock;
  const size_t m = n - lo < kBlock ? n - lo : kBlock;
  if (threadIdx.x == 0) top_bits = any_bits = 0;
  __syncthreads();

  // The values this block encodes, and its range (codec_impl.h's block_range).
  float v[kPerThread];
  const int32_t kInf = 0x7f800000;
  int32_t top = 0, any = 0;
  for (int k = 0; k < kPerThread; ++k) {
    const size_t i = threadIdx.x + k * kThreads;
    v[k] = 0.0f;
    if (i >= m) continue;
    v[k] = x[lo + i];
    if (residual != nullptr && !residual_out_only) v[k] = add(v[k], residual[lo + i]);
    const int32_t a = static_cast<int32_t>(float_bits(v[k]) & 0x7fffffffu);
    top = max(top, a < kInf ? a : 0);
    any = max(any, a);
  }
  atomicMax(&top_bits, top);
  atomicMax(&any_bits, any);
  __syncthreads();
  const float amax = bits_float(static_cast<uint32_t>(top_bits));
  const bool bad = any_bits >= kInf;

  float scale = 0.0f;  // what the block's decode multiplies by (negative: inf or nan inside)
  float inverse = 0.0f, lift = 1.0f, levels = 0.0f;
  if (kind == CodecKind::kFloat16) {
    int exponent = 0;
    frexpf(amax, &exponent);
    exponent = min(max(exponent - 15, -126), 126);
    inverse = ldexpf(1.0f, -exponent);
    scale = ldexpf(1.0f, exponent);
  } else if (kind != CodecKind::kBFloat16) {
    const int q = qmax_of(kind);
    levels = static_cast<float>(bad ? q - 1 : q);
    scale = __fdiv_rn(amax, levels);
    lift = amax < 0x1p-100f ? 0x1p100f : 1.0f;
    const float top_lifted = mul(amax, lift);
    inverse = top_lifted > 0.0f ? __fdiv_rn(levels, top_lifted) : 0.0f;
    if (bad) scale = -scale;
  }
  if (scaled(kind) && threadIdx.x == 0) memcpy(payload + 4 * b, &scale, 4);

  uint8_t* codes = payload + codes_offset(kind, nb, b);
  // The dither is a function of the value's index in the array x is a piece
  // of (`first` + its index in x), as in the CPU loops.
  const uint64_t base = first + lo;
  const uint32_t key_lo = static_cast<uint32_t>(key);
  const uint32_t key_hi = dither_key_hi(key, base);
  for (int k = 0; k < kPerThread; ++k) {
    const size_t i = threadIdx.x + k * kThreads;
    if (i >= m) continue;
    int32_t c = 0;
    if (kind == CodecKind::kBFloat16) {
      c = to_bf16(v[k]);
      memcpy(codes + 2 * i, &c, 2);
    } else if (kind == CodecKind::kFloat16) {
      const float y = mul(v[k], inverse);
      c = bad && isnan(y) ? numpy_half_nan(y) : float_to_half(y);
      memcpy(codes + 2 * i, &c, 2);
    } else {
      float y = mul(v[k], lift);
      y = mul(y, inverse);
      y = add(y, dither_of(key_lo, key_hi, static_cast<uint32_t>(base) + static_cast<uint32_t>(i)));
      y = y >= -levels ? y : -levels;
      y = y <= levels ? y : levels;
      c = static_cast<int32_t>(y);
      c -= static_cast<float>(c) > y ? 1 : 0;
      if (bad) {
        const int q = qmax_of(kind);
        if (isnan(v[k])) {
          c = -q - 1;
        } else if (isinf(v[k])) {
          c = v[k] > 0 ? q : -q;
        }
      }
      if (kind == CodecKind::kInt8) codes[i] = static_cast<uint8_t>(static_cast<int8_t>(c));
      small[i] = static_cast<int8_t>(c);
    }
    if (residual != nullptr) {
      const int32_t stored = kind == CodecKind::kInt4 ? ((c & 0x0f) ^ 8) - 8 : c;
      residual[lo + i] = sub(v[k], decode_one(kind, stored, scale));
    }
  }
  if (kind != CodecKind::kInt4) return;
  __syncthreads();
  for (size_t j = threadIdx.x; j < (m + 1) / 2; j += kThreads) {
    const uint8_t first = static_cast<uint8_t>(small[2 * j]) & 0x0fu;
    const uint8_t second = 2 * j + 1 < m ? static_cast<uint8_t>(small[2 * j + 1]) << 4 : 0;
    codes[j] = static_cast<uint8_t>(first | second);
  }
}

// acc[i] += the values of `count` payloads, in order; accumulate=false: acc =
// the (one) payload's values (decode).
__global__ void __launch_bounds__(kThreads)
    decode_kernel(CodecKind kind, const uint8_t* payloads, size_t stride, size_t count, size_t n,
                  float* acc, bool accumulate) {
  const size_t nb = blocks_of(n);
  const size_t b = blockIdx.x;
  const size_t lo = b * kBlock;
  const size_t m = n - lo < kBlock ? n - lo : kBlock;
  for (int k = 0; k < kPerThread; ++k) {
    const size_t i = threadIdx.x + k * kThreads;
    if (i >= m) continue;
    float a = accumulate ? acc[lo + i] : 0.0f;
    for (size_t j = 0; j < count; ++j) {
      const uint8_t* p = payloads + j * stride;
      const float value =
          decode_one(kind, load_code(kind, p + codes_offset(kind, nb, b), i), scale_of(kind, p, b));
      a = accumulate || j > 0 ? add(a, value) : value;
    }
    acc[lo + i] = a;
  }
}

template <typename F>
__global__ void __launch_bounds__(kThreads) convert_kernel(size_t n, F f) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    f(i);
  }
}

struct Widen {
  const uint16_t* src;
  float* dst;
  bool bf16;
  __device__ void operator()(size_t i) const {
    dst[i] = bf16 ? bfloat16_to_float(src[i]) : half_to_float(src[i]);
  }
};

struct Narrow {
  const float* src;
  uint16_t* dst;
  bool bf16;
  __device__ void operator()(size_t i) const {
    dst[i] = bf16 ? to_bf16(src[i]) : to_half_as_numpy(src[i]);
  }
};

}  // namespace kernels
}  // namespace codec
}  // namespace rr
