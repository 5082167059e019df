// The Device of one CUDA GPU: the two lanes are non-blocking CUDA streams of
// our own, ordered with CUDA events; staging memory is pinned host memory
// (cudaHostAlloc) and device memory (cudaMalloc), kept and reused from call to
// call. Compiled only in a build with CUDA (cmake/cuda.cmake).
//
// Threads and current device. mark() runs on the caller's thread, at submit,
// and restores whatever device was current there: torch and cupy share the
// driver's notion of the current device with us, so leaving ours behind would
// move their allocations. Everything else runs on the communicator's worker
// thread, which is ours, and begin() makes the device current there.
//
// Errors. Every CUDA call is checked; a failure becomes rr::Error naming the
// call and cudaGetErrorName(), and fails the collective. Nothing aborts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/page_lock.h"
#include "executor/devices.h"
#include "kernels/codec_cuda.h"
#include "reduce/cuda_kernels.h"
#include "transport/waiter.h"

namespace rr {
namespace {

// Slots start on 256-byte boundaries (cudaMalloc's alignment), so the reduce
// kernel's 16-byte loads and stores cover whole segments.
constexpr size_t kSlotAlignment = 256;

void check(cudaError_t err, const char* what, int device) {
  if (err == cudaSuccess) return;
  throw Error(std::string("CUDA ") + what + " on device " + std::to_string(device) +
              " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// page_lock's lock and unlock for CUDA (common/page_lock.h). Portable: the
// pages are pinned for every device's copies, not only the current one's.
// A failure (no memory to pin, memory CUDA cannot pin) leaves nothing locked
// and clears CUDA's error, so the caller falls back to pinned staging.
bool register_host(void* p, size_t bytes) {
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

void unregister_host(void* p) noexcept {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

// Makes `device` current on this thread while it lives, then restores the
// caller's device.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice", device);
  }
  ~CurrentDevice() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

// The same for paths that must not throw (destructors, releases): errors
// are ignored, as at interpreter exit the CUDA runtime may be unloading.
class CurrentDeviceQuietly {
 public:
  explicit CurrentDeviceQuietly(int device) {
    switched_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != device &&
                cudaSetDevice(device) == cudaSuccess;
  }
  ~CurrentDeviceQuietly() {
    if (switched_) cudaSetDevice(previous_);
  }
  CurrentDeviceQuietly(const CurrentDeviceQuietly&) = delete;
  CurrentDeviceQuietly& operator=(const CurrentDeviceQuietly&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

class CudaMark final : public StreamMark {
 public:
  ~CudaMark() override {
    if (event != nullptr) cudaEventDestroy(event);  // deferred by CUDA while waited on
  }
  cudaEvent_t event = nullptr;
};

struct FreeHost {
  void operator()(char* p) const { cudaFreeHost(p); }
};
struct FreeDevice {
  void operator()(char* p) const { cudaFree(p); }
};
using HostMemory = std::unique_ptr<char, FreeHost>;
using DeviceMemory = std::unique_ptr<char, FreeDevice>;

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device) : device_(device) {
    CurrentDevice current(device_);
    try {
      for (cudaStream_t& lane : lanes_) {
        // Non-blocking: the lanes wait for the caller's stream through the
        // mark only, never implicitly for the legacy default stream.
        check(cudaStreamCreateWithFlags(&lane, cudaStreamNonBlocking), "cudaStreamCreate", device_);
      }
      for (cudaEvent_t& event : events_) event = new_event();
      for (cudaEvent_t& event : lane_done_) event = new_event();
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaDevice() override {
    CurrentDeviceQuietly current(device_);  // a destructor must not throw
    release();
  }

  std::shared_ptr<StreamMark> mark(uintptr_t stream) override {
    CurrentDevice current(device_);
    auto mark = std::make_shared<CudaMark>();
    mark->event = new_event();
    check(cudaEventRecord(mark->event, reinterpret_cast<cudaStream_t>(stream)),
          "cudaEventRecord on the caller's stream", device_);
    return mark;
  }

  void begin(const StreamMark& mark) override {
    check(cudaSetDevice(device_), "cudaSetDevice", device_);
    const cudaEvent_t caller = static_cast<const CudaMark&>(mark).event;
    for (cudaStream_t lane : lanes_) {
      check(cudaStreamWaitEvent(lane, caller, 0), "cudaStreamWaitEvent", device_);
    }
  }

  Staging staging(size_t slots, size_t slot_bytes, size_t scratch_bytes) override {
    const size_t stride = (slot_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    const size_t slot_total = slots * stride;
    if (slot_total > slot_capacity_) {
      slot_capacity_ = 0;
      send_host_ = host_memory(slot_total);
      recv_host_ = host_memory(slot_total);
      recv_device_ = device_memory(slot_total);
      slot_capacity_ = slot_total;
    }
    if (scratch_bytes > scratch_capacity_) {
      scratch_capacity_ = 0;
      scratch_ = device_memory(scratch_bytes);
      scratch_capacity_ = scratch_bytes;
    }
    return {send_host_.get(), recv_host_.get(), recv_device_.get(), scratch_.get(), stride};
  }

  bool lock_host(void* p, size_t bytes) override {
    return page_lock::lock(p, bytes, &register_host, &unregister_host);
  }

  bool host_locked(const void* p, size_t bytes) override {
    return page_lock::locked(p, bytes, &unregister_host);
  }

  void copy(Lane lane, void* dst, const void* src, size_t bytes) override {
    // Unified addressing tells host from device memory.
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(lane)), "cudaMemcpyAsync",
          device_);
  }

  void reduce(Lane lane, DataType dtype, ReduceOp op, void* out, const void* a, const void* b,
              size_t n) override {
    check(cuda_reduce(dtype, op, out, a, b, n, stream(lane)), "reduce kernel launch", device_);
  }

  void divide(Lane lane, DataType dtype, void* data, size_t n, int divisor) override {
    check(cuda_divide(dtype, data, n, divisor, stream(lane)), "divide kernel launch", device_);
  }

  void reduce_all(Lane lane, DataType dtype, ReduceOp op, const void* const* in, int count,
                  void* const* out, int outputs, size_t n, int divisor) override {
    static_assert(kMaxReduceAll == kMaxAllSpans, "one limit on reduce_all's addresses");
    check(cuda_reduce_all(dtype, op, in, count, out, outputs, n, divisor, stream(lane)),
          "reduce_all kernel launch", device_);
  }

  void* allocate(size_t bytes) override {
    CurrentDevice current(device_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc", device_);
    return p;
  }

  void release(void* ptr) override {
    CurrentDevice current(device_);
    check(cudaFree(ptr), "cudaFree", device_);
  }

  void* allocate_shared(size_t bytes, SharedHandle* handle) override {
    static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof handle->bytes, "an IPC handle fits");
    CurrentDevice current(device_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc of a device window", device_);
    try {
      check(cudaMemset(p, 0, bytes), "cudaMemset of a device window", device_);
      cudaIpcMemHandle_t ipc;
      check(cudaIpcGetMemHandle(&ipc, p), "cudaIpcGetMemHandle", device_);
      *handle = {};
      std::memcpy(handle->bytes, &ipc, sizeof ipc);
      // The zeros are in place before any peer can read them.
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device_);
    } catch (...) {
      cudaFree(p);
      throw;
    }
    return p;
  }

  void* map_shared(const SharedHandle& handle, size_t, int peer, int peer_device) override {
    CurrentDevice current(device_);
    if (peer_device != device_) {
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, device_, peer_device), "cudaDeviceCanAccessPeer",
            device_);
      if (!can) {
        throw Error("CUDA device " + std::to_string(device_) + " has no peer access to device " +
                    std::to_string(peer_device) + ", where rank " + std::to_string(peer) +
                    "'s window is");
      }
    }
    cudaIpcMemHandle_t ipc;
    std::memcpy(&ipc, handle.bytes, sizeof ipc);
    void* p = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&p, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      throw Error("CUDA cudaIpcOpenMemHandle of rank " + std::to_string(peer) +
                  "'s device window on device " + std::to_string(device_) +
                  " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                  "); its GPU must be this one or one this GPU has peer access to");
    }
    return p;
  }

  void unmap_shared(void* mapped) noexcept override {
    CurrentDeviceQuietly current(device_);
    cudaIpcCloseMemHandle(mapped);
  }

  void release_shared(void* ptr) noexcept override {
    CurrentDeviceQuietly current(device_);
    cudaFree(ptr);
  }

  void encode(Lane lane, codec::CodecKind kind, const float* x, float* residual,
              bool residual_out_only, size_t n, uint64_t key, uint8_t* payload,
              uint64_t first) override {
    check(codec::cuda_encode(kind, x, residual, residual_out_only, n, key, payload, stream(lane),
                             first),
          "codec encode kernel launch", device_);
  }

  void decode(Lane lane, codec::CodecKind kind, const uint8_t* payload, size_t n,
              float* out) override {
    check(codec::cuda_decode(kind, payload, n, out, stream(lane)), "codec decode kernel launch",
          device_);
  }

  void decode_add(Lane lane, codec::CodecKind kind, const uint8_t* payloads, size_t stride,
                  size_t count, size_t n, float* acc) override {
    check(codec::cuda_decode_add(kind, payloads, stride, count, n, acc, stream(lane)),
          "codec decode_add kernel launch", device_);
  }

  void convert(Lane lane, DataType to, void* dst, DataType from, const void* src,
               size_t n) override {
    check(codec::cuda_convert(to, dst, from, src, n, stream(lane)), "convert kernel launch",
          device_);
  }

  void zero(Lane lane, void* ptr, size_t bytes) override {
    check(cudaMemsetAsync(ptr, 0, bytes, stream(lane)), "cudaMemsetAsync", device_);
  }

  void record(Lane lane, int event) override {
    check(cudaEventRecord(events_.at(event), stream(lane)), "cudaEventRecord", device_);
  }

  void lane_wait(Lane lane, int event) override {
    check(cudaStreamWaitEvent(stream(lane), events_.at(event), 0), "cudaStreamWaitEvent", device_);
  }

  void sync(int event, const Deadline& deadline) override { wait_for(events_.at(event), deadline); }

  void finish(const Deadline& deadline) override {
    for (size_t i = 0; i < 2; ++i) {
      check(cudaEventRecord(lane_done_[i], lanes_[i]), "cudaEventRecord", device_);
    }
    for (cudaEvent_t event : lane_done_) wait_for(event, deadline);
  }

 private:
  cudaStream_t stream(Lane lane) const { return lanes_[static_cast<int>(lane)]; }

  cudaEvent_t new_event() {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", device_);
    return event;
  }

  HostMemory host_memory(size_t bytes) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc", device_);
    return HostMemory(static_cast<char*>(p));
  }

  DeviceMemory device_memory(size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc", device_);
    return DeviceMemory(static_cast<char*>(p));
  }

  // Polls instead of blocking in cudaEventSynchronize, which has no timeout:
  // a hung kernel must end as a TimeoutError. The waiter's loop
  // (transport/waiter.h) with the event as its Waitable: a copy or kernel of
  // a batch takes tens to hundreds of microseconds, so the first 200 us of a
  // wait yields between queries (a sleep would add the timer's slack, 50 us
  // by default, to every wait); after that it sleeps in growing slices of at
  // most kMaxSleep. Nothing counts as progress short of the event itself, so
  // the deadline bounds the whole wait.
  struct EventWaiting final : Waitable {
    EventWaiting(cudaEvent_t event, int device) : event(event), device(device) {}
    bool done() const override { return finished; }
    void progress() override {
      const cudaError_t err = cudaEventQuery(event);
      if (err == cudaSuccess) {
        finished = true;
      } else if (err != cudaErrorNotReady) {
        check(err, "copy or kernel of a collective", device);
      }
    }
    uint64_t moved() const override { return 0; }
    void pause() override { std::this_thread::yield(); }
    void block(uint32_t, std::chrono::microseconds bound) override {
      std::this_thread::sleep_for(std::min(sleep, bound));
      sleep = std::min(2 * sleep, kMaxSleep);
    }
    void timed_out(const Deadline& window) override {
      throw TimeoutError("CUDA device " + std::to_string(device) +
                             " did not finish the copies and kernels of the collective within " +
                             format_seconds(window.seconds()) + " s",
                         -1);
    }

    static constexpr std::chrono::microseconds kMaxSleep{200};
    cudaEvent_t event;
    int device;
    bool finished = false;
    std::chrono::microseconds sleep{10};
  };

  void wait_for(cudaEvent_t event, const Deadline& deadline) {
    EventWaiting waiting(event, device_);
    WaitPolicy policy;
    policy.spin = std::chrono::microseconds(200);
    policy.looks_per_check = 1u << 30;  // no peer to look at
    policy.max_sleep = EventWaiting::kMaxSleep;
    wait_until_done(waiting, deadline, policy);
  }

  // With the device current. Errors are ignored: at interpreter exit the CUDA
  // runtime may already be unloading.
  void release() noexcept {
    for (cudaStream_t& lane : lanes_) {
      if (lane != nullptr) {
        cudaStreamSynchronize(lane);
        cudaStreamDestroy(lane);
      }
      lane = nullptr;
    }
    for (cudaEvent_t& event : events_) {
      if (event != nullptr) cudaEventDestroy(event);
      event = nullptr;
    }
    for (cudaEvent_t& event : lane_done_) {
      if (event != nullptr) cudaEventDestroy(event);
      event = nullptr;
    }
    send_host_.reset();
    recv_host_.reset();
    recv_device_.reset();
    scratch_.reset();
  }

  int device_;
  cudaStream_t lanes_[2] = {nullptr, nullptr};
  std::array<cudaEvent_t, kEvents> events_{};
  cudaEvent_t lane_done_[2] = {nullptr, nullptr};
  HostMemory send_host_;
  HostMemory recv_host_;
  DeviceMemory recv_device_;
  DeviceMemory scratch_;
  size_t slot_capacity_ = 0;
  size_t scratch_capacity_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int device) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw InvalidArgument("the arrays are on CUDA device " + std::to_string(device) + ", but " +
                          (count == 0 ? std::string("no CUDA device is usable here (no GPU or no "
                                                    "driver)")
                                      : std::to_string(count) + " CUDA devices are usable"));
  }
  return std::make_unique<CudaDevice>(device);
}

}  // namespace rr
