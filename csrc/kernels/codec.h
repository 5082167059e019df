// Codec kernels for compressed all-reduce: float32 values to bf16, fp16 or
// block-integer payloads and back, byte for byte what the numpy reference in
// python/ringreduce/compression/codecs.py produces (docs/compression.md).
//
// Terms (the same as codecs.py):
// - payload: the bytes of n encoded values; its size is payload_bytes(n).
// - block: kBlock consecutive values sharing one float32 scale. A block
//   payload is the nb scales, then the codes (int4: two per byte, the first
//   in the low nibble). bf16 has no scales: 2 bytes per value.
// - key: the 64-bit seed of stochastic rounding (dither.h); the Python side
//   folds a call's seed into it, so ranks that agree on the seed agree on it.
//
// Every function is single-threaded and picks the fastest build of the loops
// the CPU runs: AVX-512, AVX2 or baseline (like reduce/cpu_kernels.h). Buffers may have any
// alignment; payloads and values must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace rr {
namespace codec {

constexpr size_t kBlock = 512;

enum class CodecKind { kBFloat16, kFloat16, kInt8, kInt4 };

// The codec of a registry name ("bf16", "fp16", "int8", "int4"); throws
// InvalidArgument for another name.
CodecKind codec_kind(const char* name);

// The registry name of a codec ("bf16", "fp16", "int8", "int4").
const char* codec_name(CodecKind kind);

size_t payload_bytes(CodecKind kind, size_t n);

// Encodes x[0, n) into payload (payload_bytes(n) bytes). With a residual
// (error feedback), encodes v = x + residual instead and leaves in residual
// what the encode dropped: v - decode(payload), in one pass over the values.
// `first`: the index of x[0] in the array x is a piece of, which the dither
// of stochastic rounding is a function of (dither.h), so that a piece that
// starts at a block boundary encodes to the bytes the whole array's blocks
// there would (a call in pieces gives the bits of the call whole).
void encode(CodecKind kind, const float* x, float* residual, size_t n, uint64_t key,
            uint8_t* payload, uint64_t first = 0);

// out[0, n) = the values payload stands for.
void decode(CodecKind kind, const uint8_t* payload, size_t n, float* out);

// acc[i] += decode(payloads[j])[i] for j = 0 .. count-1 in that order, in
// float32: the owner's sum of its peers' contributions, block by block so
// that acc stays in cache while every payload is added.
void decode_add(CodecKind kind, const uint8_t* const* payloads, size_t count, size_t n, float* acc);

// dst[0, n) = src[0, n) converted, between float32 and float16 or bfloat16
// (numpy's and ml_dtypes' rounding, nan payloads included) or float32 and
// itself: a compressed call's input widened, its result narrowed. Throws
// InvalidArgument for other pairs.
void convert(DataType to, void* dst, DataType from, const void* src, size_t n);

// Which instruction set the codec loops run with ("avx512", "avx2" or
// "generic"): the best this CPU runs, unless use_kernel_isa() chose another.
const char* codec_kernel_isa();

// The variants this machine runs, best first; and the choice of one of them
// for the whole process (throws InvalidArgument, naming the runnable ones,
// for another name). Every variant computes the same bits: the choice exists
// so that tests check each against the numpy reference, and benchmarks time
// each. Safe while collectives run.
std::vector<std::string> runnable_kernel_isas();
void use_kernel_isa(const std::string& name);

}  // namespace codec
}  // namespace rr
