// The barrier probe's three ways (testing/flag_probe.h), on CUDA.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "testing/flag_probe.h"

namespace rr::testing {

namespace {

using Clock = std::chrono::steady_clock;

// The probe's flags are a cache line apart: 16 words.
constexpr size_t kFlagStride = 16;
// The memops way queues this many barriers, then waits for them: the stream
// never holds more than a few hundred operations.
constexpr int kQueued = 64;
// What the host allows past the deadline for a stream to drain once released.
constexpr double kDrainSeconds = 5;

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(std::string("flag probe: ") + what + ": " + cudaGetErrorName(err) + " (" +
              cudaGetErrorString(err) + ")");
}

void check(CUresult res, const char* what) {
  if (res == CUDA_SUCCESS) return;
  throw Error(std::string("flag probe: ") + what + " failed: CUresult " +
              std::to_string(static_cast<int>(res)));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The work each barrier follows in the "host" and "memops" ways: one thread,
// as little as a kernel can do.
__global__ void touch(unsigned* word) { *word += 1; }

// The "spin" way: every barrier in one kernel of one thread, which gives up
// once `budget_ns` have passed; *passed = the barriers it passed.
__global__ void spin_barriers(volatile uint64_t* mine, const volatile uint64_t* theirs,
                              uint64_t first, int iters, uint64_t budget_ns, int* passed) {
  const uint64_t start = global_ns();
  int i = 0;
  for (; i < iters; ++i) {
    const uint64_t value = first + static_cast<uint64_t>(i);
    *mine = value;
    __threadfence_system();
    bool late = false;
    while (*theirs < value) {
      if (global_ns() - start > budget_ns) {
        late = true;
        break;
      }
    }
    if (late) break;
  }
  *passed = i;
}

// What the probe holds on the device, released however it ends. A stream
// still stuck on a flag when it goes is the driver's to drain: destroying it
// does not wait.
struct Resources {
  void* locked = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  unsigned* word = nullptr;
  int* passed = nullptr;
  ~Resources() {
    if (passed != nullptr) cudaFree(passed);
    if (word != nullptr) cudaFree(word);
    if (event != nullptr) cudaEventDestroy(event);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (locked != nullptr) cudaHostUnregister(locked);
  }
};

template <typename F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    throw Error(std::string("flag probe: the driver has no ") + name);
  }
  return reinterpret_cast<F>(fn);
}

// Waits for `event` until the deadline; past it, releases our stream by
// writing the peer's flag (`release` = the last value it waits for) and
// waits kDrainSeconds more. Returns whether the deadline came first.
bool await_event(cudaEvent_t event, Clock::time_point deadline, uint64_t* theirs,
                 uint64_t release) {
  bool late = false;
  for (;;) {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return late;
    if (state != cudaErrorNotReady) check(state, "cudaEventQuery");
    const auto now = Clock::now();
    if (!late && now > deadline) {
      late = true;
      __atomic_store_n(theirs, release, __ATOMIC_RELEASE);
      deadline = now + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(kDrainSeconds));
    } else if (late && now > deadline) {
      throw Error("flag probe: the stream did not drain after its release");
    }
  }
}

}  // namespace

FlagProbe flag_probe(const std::string& mode, uint64_t* flags, size_t page_bytes, int rank,
                     uint64_t first, int iters, double timeout_s, int device) {
  if (mode != "host" && mode != "memops" && mode != "spin") {
    throw InvalidArgument("flag probe: mode must be host, memops or spin, not '" + mode + "'");
  }
  if (rank != 0 && rank != 1) throw InvalidArgument("flag probe: rank must be 0 or 1");
  if (iters < 1) throw InvalidArgument("flag probe: iters must be positive");
  if (!(timeout_s > 0)) throw InvalidArgument("flag probe: timeout_s must be positive");
  if (flags == nullptr || page_bytes < 4 * kFlagStride * sizeof(uint64_t)) {
    throw InvalidArgument("flag probe: the flags page is missing or too small");
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  Resources r;
  check(cudaHostRegister(flags, page_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
        "cudaHostRegister");
  r.locked = flags;
  void* mapped = nullptr;
  check(cudaHostGetDevicePointer(&mapped, flags, 0), "cudaHostGetDevicePointer");
  uint64_t* mine = flags + kFlagStride * static_cast<size_t>(rank);
  uint64_t* theirs = flags + kFlagStride * static_cast<size_t>(1 - rank);
  uint64_t* dmine = static_cast<uint64_t*>(mapped) + kFlagStride * static_cast<size_t>(rank);
  uint64_t* dtheirs = static_cast<uint64_t*>(mapped) + kFlagStride * static_cast<size_t>(1 - rank);
  check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&r.event, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaMalloc(&r.word, sizeof(unsigned)), "cudaMalloc");
  check(cudaMalloc(&r.passed, sizeof(int)), "cudaMalloc");
  // Context and module set up before the clock starts.
  touch<<<1, 1, 0, r.stream>>>(r.word);
  check(cudaGetLastError(), "launch");
  check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");

  FlagProbe result;
  const uint64_t last = first + static_cast<uint64_t>(iters) - 1;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s));
  // Both ranks set up before either starts its clock: a host handshake on the
  // ready words, so that one rank's setup is not timed as the other's barriers.
  uint64_t* ready = flags + kFlagStride * (2 + static_cast<size_t>(rank));
  const uint64_t* peer_ready = flags + kFlagStride * (2 + static_cast<size_t>(1 - rank));
  __atomic_store_n(ready, first, __ATOMIC_RELEASE);
  while (__atomic_load_n(peer_ready, __ATOMIC_ACQUIRE) < first) {
    if (Clock::now() > deadline) {
      result.timed_out = true;
      return result;
    }
  }
  const auto start = Clock::now();
  deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (mode == "host") {
    for (int i = 0; i < iters && !result.timed_out; ++i) {
      const uint64_t value = first + static_cast<uint64_t>(i);
      touch<<<1, 1, 0, r.stream>>>(r.word);
      check(cudaGetLastError(), "launch");
      check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
      __atomic_store_n(mine, value, __ATOMIC_RELEASE);
      while (__atomic_load_n(theirs, __ATOMIC_ACQUIRE) < value) {
        if (Clock::now() > deadline) {
          result.timed_out = true;
          break;
        }
      }
      if (!result.timed_out) result.completed = i + 1;
    }
  } else if (mode == "memops") {
    const auto write = driver_entry<PFN_cuStreamWriteValue64_v11070>("cuStreamWriteValue64");
    const auto wait = driver_entry<PFN_cuStreamWaitValue64_v11070>("cuStreamWaitValue64");
    const auto stream = reinterpret_cast<CUstream>(r.stream);
    while (result.completed < iters && !result.timed_out) {
      const int n = std::min(kQueued, iters - result.completed);
      for (int k = 0; k < n; ++k) {
        const uint64_t value = first + static_cast<uint64_t>(result.completed + k);
        touch<<<1, 1, 0, r.stream>>>(r.word);
        check(cudaGetLastError(), "launch");
        check(write(stream, reinterpret_cast<CUdeviceptr>(dmine), value,
                    CU_STREAM_WRITE_VALUE_DEFAULT),
              "cuStreamWriteValue64");
        check(wait(stream, reinterpret_cast<CUdeviceptr>(dtheirs), value, CU_STREAM_WAIT_VALUE_GEQ),
              "cuStreamWaitValue64");
      }
      check(cudaEventRecord(r.event, r.stream), "cudaEventRecord");
      result.timed_out = await_event(r.event, deadline, theirs, last);
      if (!result.timed_out) result.completed += n;
    }
  } else {
    const auto budget_ns = static_cast<uint64_t>(timeout_s * 1e9);
    spin_barriers<<<1, 1, 0, r.stream>>>(dmine, dtheirs, first, iters, budget_ns, r.passed);
    check(cudaGetLastError(), "launch");
    check(cudaEventRecord(r.event, r.stream), "cudaEventRecord");
    // The kernel keeps its own deadline; the host's, a little later, catches
    // a kernel that never ran.
    const auto host_deadline =
        deadline + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1));
    if (await_event(r.event, host_deadline, theirs, last)) {
      throw Error("flag probe: the spinning kernel did not finish by its deadline");
    }
    check(cudaMemcpy(&result.completed, r.passed, sizeof(int), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    result.timed_out = result.completed < iters;
  }
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace rr::testing
