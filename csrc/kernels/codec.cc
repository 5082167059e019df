// The codec entry points: argument checks, sizes, and the run-time choice
// between the AVX2 build of the loops (x86-64 CPUs that have it) and the
// baseline build, as reduce/cpu_kernels.cc does for the reductions.
#include "kernels/codec.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/codec_table.h"

namespace rr {
namespace codec {
namespace generic {
CodecFns variant_codec_fns(CodecKind kind);
}  // namespace generic

#if defined(RR_HAVE_AVX2_KERNELS)
namespace avx2 {
CodecFns variant_codec_fns(CodecKind kind);
}  // namespace avx2

static bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}
#else
static bool use_avx2() { return false; }
#endif

static CodecFns fns(CodecKind kind) {
#if defined(RR_HAVE_AVX2_KERNELS)
  if (use_avx2()) return avx2::variant_codec_fns(kind);
#endif
  return generic::variant_codec_fns(kind);
}

CodecKind codec_kind(const char* name) {
  if (std::strcmp(name, "bf16") == 0) return CodecKind::kBFloat16;
  if (std::strcmp(name, "fp16") == 0) return CodecKind::kFloat16;
  if (std::strcmp(name, "int8") == 0) return CodecKind::kInt8;
  if (std::strcmp(name, "int4") == 0) return CodecKind::kInt4;
  throw InvalidArgument(std::string("codec kernels: no kernel for codec '") + name +
                        "'; they exist for 'bf16', 'fp16', 'int8' and 'int4'");
}

size_t payload_bytes(CodecKind kind, size_t n) {
  const size_t scales = 4 * ((n + kBlock - 1) / kBlock);
  switch (kind) {
    case CodecKind::kBFloat16:
      return 2 * n;
    case CodecKind::kFloat16:
      return scales + 2 * n;
    case CodecKind::kInt8:
      return scales + n;
    case CodecKind::kInt4:
      return scales + (n + 1) / 2;
  }
  return 0;
}

void encode(CodecKind kind, const float* x, float* residual, size_t n, uint64_t key,
            uint8_t* payload) {
  if (n > 0) fns(kind).encode(x, residual, n, key, payload);
}

void decode(CodecKind kind, const uint8_t* payload, size_t n, float* out) {
  if (n > 0) fns(kind).decode(payload, n, out);
}

void decode_add(CodecKind kind, const uint8_t* const* payloads, size_t count, size_t n,
                float* acc) {
  if (n > 0 && count > 0) fns(kind).decode_add(payloads, count, n, acc);
}

const char* codec_kernel_isa() { return use_avx2() ? "avx2" : "generic"; }

}  // namespace codec
}  // namespace rr
