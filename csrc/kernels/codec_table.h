// The type-erased entry points of one codec, as each instruction-set variant
// of the loops (codec_impl.h) hands them to the dispatcher (codec.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rr {
namespace codec {

using EncodeFn = void (*)(const float* x, float* residual, size_t n, uint64_t key,
                          uint64_t first, uint8_t* payload);
using DecodeFn = void (*)(const uint8_t* payload, size_t n, float* out);
using DecodeAddFn = void (*)(const uint8_t* const* payloads, size_t count, size_t n, float* acc);

struct CodecFns {
  EncodeFn encode;
  DecodeFn decode;
  DecodeAddFn decode_add;
};

}  // namespace codec
}  // namespace rr
