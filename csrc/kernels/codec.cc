// The codec entry points: argument checks, sizes, and the run-time choice
// between the builds of the loops: AVX-512 (F, BW, VL, DQ: x86-64 CPUs that
// have them), AVX2 (with F16C), and the baseline build, as
// reduce/cpu_kernels.cc does for the reductions.
#include "kernels/codec.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/codec_scalar.h"
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
namespace avx512 {
CodecFns variant_codec_fns(CodecKind kind);
}  // namespace avx512
#endif

namespace {

struct Variant {
  const char* name;
  CodecFns (*fns)(CodecKind);
  bool runs;  // whether this CPU (and its OS) runs the variant's instructions
};

// Best first. Every variant computes the same bits (codec_impl.h), so which
// one runs changes only the speed.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = [] {
    std::vector<Variant> v;
#if defined(RR_HAVE_AVX2_KERNELS)
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    v.push_back({"avx512", &avx512::variant_codec_fns,
                 avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")});
    v.push_back({"avx2", &avx2::variant_codec_fns, avx2});
#endif
    v.push_back({"generic", &generic::variant_codec_fns, true});
    return v;
  }();
  return all;
}

const Variant* best_variant() {
  for (const Variant& v : variants()) {
    if (v.runs) return &v;
  }
  return &variants().back();
}

// The variant in use: the best one this CPU runs, unless use_kernel_isa()
// picked another (tests and bench/codec_speed.py compare them).
std::atomic<const Variant*>& current() {
  static std::atomic<const Variant*> v{best_variant()};
  return v;
}

CodecFns fns(CodecKind kind) { return current().load(std::memory_order_relaxed)->fns(kind); }

}  // namespace

CodecKind codec_kind(const char* name) {
  if (std::strcmp(name, "bf16") == 0) return CodecKind::kBFloat16;
  if (std::strcmp(name, "fp16") == 0) return CodecKind::kFloat16;
  if (std::strcmp(name, "int8") == 0) return CodecKind::kInt8;
  if (std::strcmp(name, "int4") == 0) return CodecKind::kInt4;
  throw InvalidArgument(std::string("codec kernels: no kernel for codec '") + name +
                        "'; they exist for 'bf16', 'fp16', 'int8' and 'int4'");
}

void convert(DataType to, void* dst, DataType from, const void* src, size_t n) {
  if (to == from && to == DataType::kFloat32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  if (from == DataType::kFloat32) {
    const float* in = static_cast<const float*>(src);
    uint16_t* out = static_cast<uint16_t*>(dst);
    if (to == DataType::kFloat16) {
      for (size_t i = 0; i < n; ++i) out[i] = to_half_as_numpy(in[i]);
      return;
    }
    if (to == DataType::kBFloat16) {
      for (size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
      return;
    }
  } else if (to == DataType::kFloat32) {
    const uint16_t* in = static_cast<const uint16_t*>(src);
    float* out = static_cast<float*>(dst);
    if (from == DataType::kFloat16) {
      for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
      return;
    }
    if (from == DataType::kBFloat16) {
      for (size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float(in[i]);
      return;
    }
  }
  throw InvalidArgument(std::string("codec convert: no conversion from ") + dtype_name(from) +
                        " to " + dtype_name(to));
}

const char* codec_name(CodecKind kind) {
  switch (kind) {
    case CodecKind::kBFloat16:
      return "bf16";
    case CodecKind::kFloat16:
      return "fp16";
    case CodecKind::kInt8:
      return "int8";
    case CodecKind::kInt4:
      return "int4";
  }
  return "?";
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
            uint8_t* payload, uint64_t first) {
  if (n > 0) fns(kind).encode(x, residual, n, key, first, payload);
}

void decode(CodecKind kind, const uint8_t* payload, size_t n, float* out) {
  if (n > 0) fns(kind).decode(payload, n, out);
}

void decode_add(CodecKind kind, const uint8_t* const* payloads, size_t count, size_t n,
                float* acc) {
  if (n > 0 && count > 0) fns(kind).decode_add(payloads, count, n, acc);
}

const char* codec_kernel_isa() { return current().load()->name; }

std::vector<std::string> runnable_kernel_isas() {
  std::vector<std::string> names;
  for (const Variant& v : variants()) {
    if (v.runs) names.emplace_back(v.name);
  }
  return names;
}

void use_kernel_isa(const std::string& name) {
  for (const Variant& v : variants()) {
    if (v.runs && name == v.name) {
      current().store(&v);
      return;
    }
  }
  std::string runnable;
  for (const std::string& n : runnable_kernel_isas())
    runnable += (runnable.empty() ? "'" : ", '") + n + "'";
  throw InvalidArgument("codec kernels: no variant '" + name + "' runs on this machine; " +
                        "these do: " + runnable);
}

}  // namespace codec
}  // namespace rr
