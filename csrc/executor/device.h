// What the device executor needs from a device whose memory the transport
// cannot read or write (a GPU): asynchronous copies and reductions, and events
// that order them. The schedules never see CUDA: executor/cuda_device.cc
// implements this with CUDA streams and events, executor/fake_device.cc with
// memcpy and the CPU kernels, so that tests run the very same executor on a
// machine without a GPU.
//
// Work is queued on two lanes. Each lane runs its work in the order it was
// queued, independently of the other lane and of the calling thread, like a
// CUDA stream. kToHost carries the device-to-host copies of data about to be
// sent; kToDevice carries everything that writes device memory (host-to-device
// copies of received data, reductions, divisions, device-to-device copies).
// Two lanes let a copy out and a copy in (separate copy engines on a GPU) run
// at the same time as each other and as a reduction kernel.
//
// Ordering across lanes and with the host is explicit, with a small fixed set
// of events numbered 0..kEvents-1: record() marks how far a lane has been
// queued, sync() blocks the host until the lane has run that far, lane_wait()
// makes another lane wait for it. As with CUDA events, a sync or a wait refers
// to the most recent record() before it, and an event never recorded counts as
// reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/deadline.h"
#include "common/dtype.h"
#include "kernels/codec.h"

namespace rr {

enum class Lane : int { kToHost = 0, kToDevice = 1 };

// The caller's stream as it was when the collective was submitted: the
// collective touches the caller's memory only after the work queued on that
// stream before the call. Opaque; only the Device that made it reads it.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
};

// Memory a Device lends the device executor. It is reused from call to call, so a
// collective allocates nothing once the sizes have been seen.
struct Staging {
  char* send_host;     // slots x slot_stride bytes of pinned host memory, on the way out
  char* recv_host;     // slots x slot_stride bytes of pinned host memory, on the way in
  char* recv_device;   // slots x slot_stride bytes of device memory, waiting to be reduced
  char* scratch;       // device memory for partial sums, as many bytes as asked for
  size_t slot_stride;  // >= the slot size asked for, rounded up for aligned loads
};

class Device {
 public:
  static constexpr int kEvents = 16;

  virtual ~Device() = default;

  // On the caller's thread, when the collective is submitted: captures the
  // work queued so far on `stream` (a cudaStream_t, 0 for the legacy default
  // stream). It must be this thread: a per-thread default stream is the
  // caller's, and work the caller queues after the call must not be waited for.
  virtual std::shared_ptr<StreamMark> mark(uintptr_t stream) = 0;

  // On the worker thread, first: makes this device current there and makes
  // both lanes wait for `mark`.
  virtual void begin(const StreamMark& mark) = 0;

  // The staging memory, grown if smaller than asked. Only between collectives
  // (no work queued), since growing frees the old memory.
  virtual Staging staging(size_t slots, size_t slot_bytes, size_t scratch_bytes) = 0;

  // Queues dst = src (bytes) on `lane`; either side may be host or device
  // memory. The ranges must not overlap.
  virtual void copy(Lane lane, void* dst, const void* src, size_t bytes) = 0;
  // Queues out = a op b over n elements (kAvg sums); out may be a or b.
  virtual void reduce(Lane lane, DataType dtype, ReduceOp op, void* out, const void* a,
                      const void* b, size_t n) = 0;
  // Queues data /= divisor over n elements of a floating dtype.
  virtual void divide(Lane lane, DataType dtype, void* data, size_t n, int divisor) = 0;
  // Queues, in one pass (one kernel), v = in[0] op in[1] op ... op in[count-1]
  // over n elements, in rank order and in the dtype's compute type (16-bit
  // floats accumulate in float32), divided by `divisor` when it is > 0 (avg),
  // rounded to the dtype once, and written into out[0..outputs): reduce_all()'s
  // bits (reduce/cpu_kernels.h). An output may be an input, and any address a
  // peer's memory mapped here (map_shared). 1 <= count <= kMaxReduceAll and
  // outputs <= kMaxReduceAll: a kernel's arguments carry the addresses.
  static constexpr int kMaxReduceAll = 16;
  virtual void reduce_all(Lane lane, DataType dtype, ReduceOp op, const void* const* in, int count,
                          void* const* out, int outputs, size_t n, int divisor) = 0;

  // ---- compressed collectives on device arrays (kernels/codec.h) ----
  // The codec's operations on device memory, the same bits as the CPU loops;
  // the payloads are device memory too (the caller copies them to the host
  // and back with copy()).

  // Device memory of its own, for the codec's scratch; release() frees it.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  // Queues payload = encode(x) (n values; payload_bytes(kind, n) bytes). With a
  // residual: encodes x + residual and leaves what the encode dropped in it;
  // with residual_out_only, encodes x alone and writes what it dropped.
  // `first`: x[0]'s index in the array x is a piece of (codec.h's encode).
  virtual void encode(Lane lane, codec::CodecKind kind, const float* x, float* residual,
                      bool residual_out_only, size_t n, uint64_t key, uint8_t* payload,
                      uint64_t first) = 0;
  // Queues out[0, n) = the values of payload.
  virtual void decode(Lane lane, codec::CodecKind kind, const uint8_t* payload, size_t n,
                      float* out) = 0;
  // Queues acc[i] += the values of payload j, for j = 0 .. count-1 in order;
  // payload j starts at payloads + j * stride.
  virtual void decode_add(Lane lane, codec::CodecKind kind, const uint8_t* payloads,
                          size_t stride, size_t count, size_t n, float* acc) = 0;
  // Queues dst = src converted, n values; float32 to or from float16 or
  // bfloat16 (round to nearest even, as numpy and ml_dtypes cast).
  virtual void convert(Lane lane, DataType to, void* dst, DataType from, const void* src,
                       size_t n) = 0;
  // Queues bytes zero bytes at ptr.
  virtual void zero(Lane lane, void* ptr, size_t bytes) = 0;

  // ---- memory the ranks of a host share (device windows) ----
  // Device memory of `bytes` (> 0), zeroed, that another process on this host
  // can map: cudaMalloc'd memory and its CUDA IPC handle, or for the fake
  // device a shared-memory segment and its record. The handle is opaque to
  // everyone but a Device of the same kind.
  struct SharedHandle {
    unsigned char bytes[64];
  };
  virtual void* allocate_shared(size_t bytes, SharedHandle* handle) = 0;
  // Maps a peer's allocation of `bytes` on CUDA device `peer_device` (its
  // handle) here; throws Error naming `peer` when it cannot, as where this
  // device has no peer access to that one.
  virtual void* map_shared(const SharedHandle& handle, size_t bytes, int peer, int peer_device) = 0;
  // Undo map_shared and allocate_shared. Never throw: they run when the last
  // array over a window goes, whatever state the device is in.
  virtual void unmap_shared(void* mapped) noexcept = 0;
  virtual void release_shared(void* ptr) noexcept = 0;

  // ---- host memory the device copies in place ----
  // Page-locks host memory of this process (a transport's inbox,
  // Transport::view_region) so that copies between it and the device run as
  // from pinned memory; it stays locked until it is unmapped (whoever unmaps
  // it calls common/page_lock.h's forget() first). True once it is locked for
  // this kind of device; false where it cannot be, and then nothing changed.
  virtual bool lock_host(void* p, size_t bytes) = 0;
  // Whether [p, p + bytes) lies in memory lock_host() locked.
  virtual bool host_locked(const void* p, size_t bytes) = 0;

  virtual void record(Lane lane, int event) = 0;
  virtual void lane_wait(Lane lane, int event) = 0;
  // Throws TimeoutError when the device has not got there by the deadline.
  virtual void sync(int event, const Deadline& deadline) = 0;

  // Blocks until everything queued on both lanes has run; the caller's memory
  // is then final. Also the way out after an error: no queued copy may write
  // the caller's memory after the collective has returned.
  virtual void finish(const Deadline& deadline) = 0;
};

}  // namespace rr
