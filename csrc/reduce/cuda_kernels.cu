// CUDA reduction kernels. One element-wise kernel template serves every entry
// of the (dtype x op) table and the average's division; the per-element
// arithmetic is rr::apply<Type, Op> from ops.h, the very function the CPU
// kernels run, so both sides round the same way.
//
// Terms: a pack is 16 bytes of elements, moved by one vector load or store
// (8 float16, 4 float32, 2 float64, 16 int8, ...). The head is the elements
// before the first 16-byte boundary, the tail those after the last whole pack;
// both go element by element.
#include <algorithm>
#include <cstdint>

#include "reduce/cuda_kernels.h"
#include "reduce/ops.h"

namespace rr {
namespace {

constexpr int kThreads = 256;
// sm_80 and sm_90 both hold 2048 resident threads per SM.
constexpr int kMaxThreadsPerSm = 2048;
constexpr size_t kPackBytes = 16;

template <typename S>
struct alignas(kPackBytes) Pack {
  static constexpr int kSize = kPackBytes / sizeof(S);
  // Packs each thread loads before it computes: several 16-byte requests in
  // flight per thread are what keeps HBM busy. Narrow types unroll less, as
  // their packs unpack into more registers (16 int8 each), which would
  // otherwise cut the number of resident threads.
  static constexpr int kUnroll = kSize >= 16 ? 1 : (kSize >= 8 ? 2 : 4);
  S v[kSize];
};

// out = a op b, element by element, with the shared functor.
template <typename Type, typename Op>
struct ApplyOp {
  using S = typename Type::storage;
  __device__ __forceinline__ S operator()(S a, S b) const { return apply<Type, Op>(a, b); }
};

// data = data / divisor in the compute type; the second operand is unused.
template <typename Type>
struct DivideBy {
  using S = typename Type::storage;
  typename Type::compute divisor;
  __device__ __forceinline__ S operator()(S a, S) const {
    return Type::store(Type::load(a) / divisor);
  }
};

// out[i] = f(a[i], b[i]) for i < n: `packs` whole packs starting at element
// `head` (where all three pointers are 16-byte aligned), the head and the tail
// as single elements. Grid-stride loops, so any grid size is correct.
//
// No __restrict__: out may be a or b. Each index is read and then written by
// one thread only, so in-place use is safe.
template <typename S, typename F>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(S* out, const S* a, const S* b, size_t head, size_t packs, size_t n, F f) {
  using P = Pack<S>;
  constexpr int kUnroll = P::kUnroll;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  P* out_packs = reinterpret_cast<P*>(out + head);
  const P* a_packs = reinterpret_cast<const P*>(a + head);
  const P* b_packs = reinterpret_cast<const P*>(b + head);

  for (size_t base = first; base < packs; base += stride * kUnroll) {
    P x[kUnroll];
    P y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < packs) {
        x[u] = a_packs[i];
        y[u] = b_packs[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < packs) {
        P r;
#pragma unroll
        for (int k = 0; k < P::kSize; ++k) r.v[k] = f(x[u].v[k], y[u].v[k]);
        out_packs[i] = r;
      }
    }
  }
  // The head is shorter than a pack, so one pass of the grid covers it.
  if (first < head) out[first] = f(a[first], b[first]);
  for (size_t i = head + packs * P::kSize + first; i < n; i += stride) out[i] = f(a[i], b[i]);
}

size_t pack_offset(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPackBytes; }

// At most enough blocks for every SM of the current device to hold its 2048
// threads (one wave where registers allow, two for the 64-register kernels);
// the grid-stride loops cover the rest of the work.
cudaError_t grid_size(size_t work_items, int* blocks) {
  int device = 0;
  int sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const size_t cap = static_cast<size_t>(std::max(sms, 1)) * (kMaxThreadsPerSm / kThreads);
  const size_t wanted = (work_items + kThreads - 1) / kThreads;
  *blocks = static_cast<int>(std::max<size_t>(1, std::min(wanted, cap)));
  return cudaSuccess;
}

template <typename S, typename F>
cudaError_t launch(S* out, const S* a, const S* b, size_t n, F f, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr size_t kPerPack = Pack<S>::kSize;
  constexpr size_t kUnroll = Pack<S>::kUnroll;
  // Packs need out, a and b equally far from a 16-byte boundary (a chunk at
  // the same offset of 16-byte aligned buffers is); otherwise every element
  // goes alone.
  const size_t offset = pack_offset(a);
  const bool packable =
      offset % sizeof(S) == 0 && pack_offset(out) == offset && pack_offset(b) == offset;
  const size_t head = packable ? std::min(n, (kPackBytes - offset) % kPackBytes / sizeof(S)) : 0;
  const size_t packs = packable ? (n - head) / kPerPack : 0;
  const size_t singles = n - packs * kPerPack;
  int blocks = 0;
  const cudaError_t err = grid_size(std::max((packs + kUnroll - 1) / kUnroll, singles), &blocks);
  if (err != cudaSuccess) return err;
  elementwise_kernel<<<blocks, kThreads, 0, stream>>>(out, a, b, head, packs, n, f);
  return cudaGetLastError();
}

template <typename Type, typename Op>
cudaError_t launch_reduce(void* out, const void* a, const void* b, size_t n, cudaStream_t stream) {
  using S = typename Type::storage;
  return launch(static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), n,
                ApplyOp<Type, Op>{}, stream);
}

template <typename Type>
cudaError_t reduce_typed(ReduceOp op, void* out, const void* a, const void* b, size_t n,
                         cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return launch_reduce<Type, SumOp>(out, a, b, n, stream);
    case ReduceOp::kProd:
      return launch_reduce<Type, ProdOp>(out, a, b, n, stream);
    case ReduceOp::kMin:
      return launch_reduce<Type, MinOp>(out, a, b, n, stream);
    case ReduceOp::kMax:
      return launch_reduce<Type, MaxOp>(out, a, b, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename Type>
cudaError_t divide_typed(void* data, size_t n, int divisor, cudaStream_t stream) {
  using S = typename Type::storage;
  S* d = static_cast<S*>(data);
  const DivideBy<Type> f{static_cast<typename Type::compute>(divisor)};
  return launch(d, d, d, n, f, stream);
}

// reduce_all's addresses, passed by value as the kernel's argument.
template <typename S>
struct Spans {
  const S* in[kMaxAllSpans];
  S* out[kMaxAllSpans];
  int count;
  int outputs;
  int divisor;  // > 0: divide by it (avg)
};

// avg's division, in the compute type, before the one rounding.
template <typename C>
__device__ __forceinline__ C divided(C acc, int divisor) {
  return divisor > 0 ? acc / static_cast<C>(divisor) : acc;
}

// For i < n: v = in[0][i] op ... op in[count-1][i] in the compute type, then
// v / divisor, rounded once, written into out[0..outputs)[i]. `packs` whole
// packs from element `head` where every address is equally far from a 16-byte
// boundary, single elements elsewhere. No __restrict__: an output may be an
// input; each element is read from every input by one thread before that
// thread writes it, so that is safe.
template <typename Type, typename Op>
__global__ void __launch_bounds__(kThreads)
    reduce_all_kernel(Spans<typename Type::storage> s, size_t head, size_t packs, size_t n) {
  using S = typename Type::storage;
  using C = typename Type::compute;
  using P = Pack<S>;
  constexpr int kUnroll = P::kUnroll;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t base = first; base < packs; base += stride * kUnroll) {
    C acc[kUnroll][P::kSize];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < packs) {
        const P x = reinterpret_cast<const P*>(s.in[0] + head)[i];
#pragma unroll
        for (int k = 0; k < P::kSize; ++k) acc[u][k] = Type::load(x.v[k]);
      }
    }
    for (int r = 1; r < s.count; ++r) {
      P x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + u * stride;
        if (i < packs) x[u] = reinterpret_cast<const P*>(s.in[r] + head)[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * stride < packs) {
#pragma unroll
          for (int k = 0; k < P::kSize; ++k) acc[u][k] = Op()(acc[u][k], Type::load(x[u].v[k]));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
      if (i < packs) {
        P v;
#pragma unroll
        for (int k = 0; k < P::kSize; ++k) {
          v.v[k] = Type::store(divided(acc[u][k], s.divisor));
        }
        for (int o = 0; o < s.outputs; ++o) reinterpret_cast<P*>(s.out[o] + head)[i] = v;
      }
    }
  }
  auto single = [&](size_t i) {
    C acc = Type::load(s.in[0][i]);
    for (int r = 1; r < s.count; ++r) acc = Op()(acc, Type::load(s.in[r][i]));
    const S v = Type::store(divided(acc, s.divisor));
    for (int o = 0; o < s.outputs; ++o) s.out[o][i] = v;
  };
  if (first < head) single(first);
  for (size_t i = head + packs * P::kSize + first; i < n; i += stride) single(i);
}

template <typename Type, typename Op>
cudaError_t launch_all(const void* const* in, int count, void* const* out, int outputs, size_t n,
                       int divisor, cudaStream_t stream) {
  using S = typename Type::storage;
  if (n == 0 || outputs == 0) return cudaSuccess;
  Spans<S> s{};
  const size_t offset = pack_offset(in[0]);
  bool packable = offset % sizeof(S) == 0;
  for (int r = 0; r < count; ++r) {
    s.in[r] = static_cast<const S*>(in[r]);
    packable = packable && pack_offset(in[r]) == offset;
  }
  for (int o = 0; o < outputs; ++o) {
    s.out[o] = static_cast<S*>(out[o]);
    packable = packable && pack_offset(out[o]) == offset;
  }
  s.count = count;
  s.outputs = outputs;
  s.divisor = divisor;
  constexpr size_t kPerPack = Pack<S>::kSize;
  constexpr size_t kUnroll = Pack<S>::kUnroll;
  const size_t head = packable ? std::min(n, (kPackBytes - offset) % kPackBytes / sizeof(S)) : 0;
  const size_t packs = packable ? (n - head) / kPerPack : 0;
  const size_t singles = n - packs * kPerPack;
  int blocks = 0;
  const cudaError_t err = grid_size(std::max((packs + kUnroll - 1) / kUnroll, singles), &blocks);
  if (err != cudaSuccess) return err;
  reduce_all_kernel<Type, Op><<<blocks, kThreads, 0, stream>>>(s, head, packs, n);
  return cudaGetLastError();
}

template <typename Type>
cudaError_t reduce_all_typed(ReduceOp op, const void* const* in, int count, void* const* out,
                             int outputs, size_t n, int divisor, cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return launch_all<Type, SumOp>(in, count, out, outputs, n, divisor, stream);
    case ReduceOp::kProd:
      return launch_all<Type, ProdOp>(in, count, out, outputs, n, divisor, stream);
    case ReduceOp::kMin:
      return launch_all<Type, MinOp>(in, count, out, outputs, n, divisor, stream);
    case ReduceOp::kMax:
      return launch_all<Type, MaxOp>(in, count, out, outputs, n, divisor, stream);
  }
  return cudaErrorInvalidValue;
}

// Calls fn(Type{}) with the Type (ops.h) of `dtype`.
template <typename Fn>
cudaError_t with_type(DataType dtype, Fn fn) {
  switch (dtype) {
    case DataType::kFloat16:
      return fn(Float16Type{});
    case DataType::kBFloat16:
      return fn(BFloat16Type{});
    case DataType::kFloat32:
      return fn(Float32Type{});
    case DataType::kFloat64:
      return fn(Float64Type{});
    case DataType::kInt8:
      return fn(Int8Type{});
    case DataType::kUInt8:
      return fn(UInt8Type{});
    case DataType::kInt32:
      return fn(Int32Type{});
    case DataType::kInt64:
      return fn(Int64Type{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t cuda_reduce(DataType dtype, ReduceOp op, void* out, const void* a, const void* b,
                        size_t n, cudaStream_t stream) {
  return with_type(
      dtype, [&](auto type) { return reduce_typed<decltype(type)>(op, out, a, b, n, stream); });
}

cudaError_t cuda_reduce_all(DataType dtype, ReduceOp op, const void* const* in, int count,
                            void* const* out, int outputs, size_t n, int divisor,
                            cudaStream_t stream) {
  if (count < 1 || count > kMaxAllSpans || outputs < 0 || outputs > kMaxAllSpans) {
    return cudaErrorInvalidValue;
  }
  return with_type(dtype, [&](auto type) {
    return reduce_all_typed<decltype(type)>(op, in, count, out, outputs, n, divisor, stream);
  });
}

cudaError_t cuda_divide(DataType dtype, void* data, size_t n, int divisor, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kFloat16:
      return divide_typed<Float16Type>(data, n, divisor, stream);
    case DataType::kBFloat16:
      return divide_typed<BFloat16Type>(data, n, divisor, stream);
    case DataType::kFloat32:
      return divide_typed<Float32Type>(data, n, divisor, stream);
    case DataType::kFloat64:
      return divide_typed<Float64Type>(data, n, divisor, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no GPU: clear the runtime's sticky last error so later
    // calls do not report it.
    cudaGetLastError();
    return 0;
  }
  return count;
}

cudaError_t cuda_pointer_device(const void* ptr, int* device) {
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) return err;
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return cudaErrorInvalidValue;
  }
  *device = attributes.device;
  return cudaSuccess;
}

}  // namespace rr
