// The CUDA codec kernels (csrc/kernels/codec_cuda_kernels.cuh) compiled for the
// CPU, so that tests/test_codec_cuda_emulated.py can compare their bytes with
// the CPU loops' on a machine without a GPU: the very same kernel source, with
// each CUDA thread a host thread, the threads of a block meeting at a barrier
// for __syncthreads, and blocks run one after another (so __shared__ variables
// can be statics). The intrinsics are plain IEEE operations (compiled with
// -ffp-contract=off), which is what __fadd_rn and friends are. Built by the
// test with the host compiler; a C interface, loaded with ctypes.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

// ---- the CUDA execution model, on host threads ----------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct EmulatedDim {
  unsigned x = 0, y = 1, z = 1;
};
thread_local EmulatedDim threadIdx, blockIdx;
EmulatedDim blockDim, gridDim;
std::barrier<>* block_barrier = nullptr;

inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline int atomicMax(int* address, int value) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::isinf;
using std::isnan;
using std::max;
using std::min;
using std::signbit;

#include "kernels/codec_cuda_kernels.cuh"

namespace {

using namespace rr::codec;

// kernel<<<grid, block>>>(args...), one block at a time.
template <typename Kernel, typename... Args>
void launch(unsigned grid, unsigned block, Kernel kernel, Args... args) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> barrier(block);
    block_barrier = &barrier;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([=] {
        blockIdx.x = b;
        threadIdx.x = t;
        kernel(args...);
      });
    }
    for (std::thread& t : threads) t.join();
  }
}

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

extern "C" {

// The launches of codec_cuda.cu, with the same grids.
void emulated_encode(int kind, const float* x, float* residual, int residual_out_only, size_t n,
                     uint64_t key, uint8_t* payload, uint64_t first) {
  if (n == 0) return;
  launch(blocks_for(n), kernels::kThreads, kernels::encode_kernel, static_cast<CodecKind>(kind), x,
         residual, residual_out_only != 0, n, key, payload, first);
}

void emulated_decode_add(int kind, const uint8_t* payloads, size_t stride, size_t count, size_t n,
                         float* acc, int accumulate) {
  if (n == 0 || count == 0) return;
  launch(blocks_for(n), kernels::kThreads, kernels::decode_kernel, static_cast<CodecKind>(kind),
         payloads, stride, count, n, acc, accumulate != 0);
}

// float32 <-> float16 (half = 0) or bfloat16 (half = 1); widen = 1: half -> float32.
void emulated_convert(int half, int widen, void* dst, const void* src, size_t n) {
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65535));
  const bool bf16 = half == 1;
  if (widen) {
    launch(grid, kernels::kThreads, kernels::convert_kernel<kernels::Widen>, n,
           kernels::Widen{static_cast<const uint16_t*>(src), static_cast<float*>(dst), bf16});
  } else {
    launch(grid, kernels::kThreads, kernels::convert_kernel<kernels::Narrow>, n,
           kernels::Narrow{static_cast<const float*>(src), static_cast<uint16_t*>(dst), bf16});
  }
}

}  // extern "C"
