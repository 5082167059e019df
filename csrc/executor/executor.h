// The seam between a collective's schedule and the memory it runs on.
//
// Every collective is written once (algorithms/*.cc) as a sequence of steps
// over segments and a few local operations. An executor runs them for one kind
// of memory:
//   HostExecutor   - memory the CPU and the transport can touch: segments go
//                    to the transport as they are, reductions run on the CPU
//                    kernels.
//   DeviceExecutor - a GPU's memory, which the transport cannot touch: each
//                    segment is moved through pinned staging memory, and
//                    reductions run as kernels on the device (executor/device.h).
// Adding a collective means writing its schedule once; adding a kind of
// memory means writing one executor.
//
// Both executors cut a step into the same segments (executor/segments.h)
// and send each as one message, so ranks whose
// buffers live in different kinds of memory can run one collective together.
//
// Ordering: an executor's steps and local operations take effect in the order
// they are issued. A step sends what earlier operations wrote, and a local
// operation sees what earlier steps received. Operations may still be in
// flight when the call that issued them returns (the device executor queues
// them on streams); finish() waits for all of them, after which the caller's
// memory holds the result.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "common/deadline.h"
#include "common/dtype.h"
#include "kernels/codec.h"
#include "transport/transport.h"

namespace rr {

// What every executor is made with: one collective's link to its peers and
// the shape of its data.
struct ExecutorSetup {
  Transport& transport;
  double timeout_seconds;  // each wait gives up after this long without progress
  size_t segment_bytes;    // the message size, before rounding to whole elements
  DataType dtype;
  ReduceOp op;
  size_t scratch_bytes;                  // what the schedule needs from scratch()
  const Interrupt* interrupt = nullptr;  // asked while waits run (see Deadline)
  // Device executor: the most bytes one copy between device and host staging
  // moves (a slot; at least a segment). Unused on the host.
  size_t staging_bytes = 0;
  // Device executor: receive messages as views where the transport lends them
  // in memory the device can page-lock, and copy them onto the device from
  // there (device_executor.h, "landing in place"). Unused on the host.
  bool land_in_place = false;
  // Host executor: a step reducing at least this many bytes out of place
  // writes them with streaming stores (Options::stream_store_bytes; 0: never).
  size_t stream_store_bytes = 0;

  Deadline deadline() const { return Deadline::after(timeout_seconds, interrupt); }
};

// One step from this rank's point of view: send one region to `send_to`
// while receiving another from `recv_from`. Either region may be empty; an
// empty region is not sent (or expected) at all.
struct StepPlan {
  int send_to = -1;
  const char* send = nullptr;
  size_t send_bytes = 0;

  int recv_from = -1;
  char* recv = nullptr;  // where the received bytes end up
  size_t recv_bytes = 0;
  // When set, the received data is reduced: recv = reduce_with op received
  // (reduce_with may equal recv). Each segment is reduced as it arrives.
  const char* reduce_with = nullptr;
  // With reduce_with, when > 1: each reduced segment is then divided by it,
  // while it is still in cache (avg, on the owner's last reduce-scatter step):
  // the same bits as dividing the whole region afterwards, without another
  // pass over memory.
  int divide_by = 0;
  // Also send each received segment on to `send_to` once it is in place: a
  // relay (broadcast), in the same step. Not combined with reduce_with.
  bool forward = false;
};

// The local operations of compressed collectives (algorithms/one_hop.cc), on
// float32 values and codec payloads in the collective's kind of memory, with
// the bits of the CPU codec loops (kernels/codec.h) wherever they run.
class CodecOps {
 public:
  virtual ~CodecOps() = default;
  // payload = encode(x + residual) (codec::encode; residual may be null).
  // residual_out_only: encodes x alone, and writes what it dropped into
  // residual.
  virtual void encode(codec::CodecKind kind, const float* x, float* residual,
                      bool residual_out_only, size_t n, uint64_t key, uint8_t* payload,
                      uint64_t first) = 0;
  virtual void decode(codec::CodecKind kind, const uint8_t* payload, size_t n, float* out) = 0;
  // acc += the values of payloads[0], then payloads[1], ... (codec::decode_add).
  virtual void decode_add(codec::CodecKind kind, const uint8_t* const* payloads, size_t count,
                          size_t n, float* acc) = 0;
  // dst = src, between float32 and float16 or bfloat16 (numpy's and
  // ml_dtypes' rounding) or float32 and itself.
  virtual void convert(DataType to, void* dst, DataType from, const void* src, size_t n) = 0;
  // out = a + b, float32 (out may be a).
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;
  // data /= divisor, float32.
  virtual void divide(float* data, size_t n, int divisor) = 0;
  // data = +0.0 (n float32 values).
  virtual void zero(float* data, size_t n) = 0;
  // dst (host memory) = src (this memory), bytes; final once settle() returns.
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  // Waits until every operation queued so far has run.
  virtual void settle() = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Scratch memory of the collective's kind: as many bytes as the schedule
  // asked for when the executor was made, valid until the collective ends.
  virtual char* scratch() = 0;

  virtual void step(const StepPlan& plan) = 0;
  // Several steps with different peers at once (none reducing or
  // forwarding): their sends and receives may all be in flight together. By
  // default they run one after the other, which gives the same result.
  virtual void exchange(const std::vector<StepPlan>& plans) {
    for (const StepPlan& plan : plans) step(plan);
  }

  // The direct all_reduce's data movement and reduction in one (small
  // messages, algorithms/small_all_reduce.cc), over the transport's ranks
  // 0..size-1 with this one at `rank`: `send`'s `count` elements to every
  // other rank at once, then recv = every rank's vector reduced in rank order
  // (avg not yet divided). Returns false where this executor has no such
  // route for these buffers: the schedule then gathers the vectors into
  // scratch() and reduces there.
  virtual bool direct_reduce(int rank, int size, const void* send, void* recv, size_t count) {
    (void)rank;
    (void)size;
    (void)send;
    (void)recv;
    (void)count;
    return false;
  }

  // Local operations on the collective's memory, over whole elements of the
  // collective's dtype, with its reduction op.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // ranges must not overlap
  virtual void reduce(void* out, const void* a, const void* b, size_t n) = 0;  // out may be a or b
  virtual void divide(void* data, size_t n, int divisor) = 0;  // floating dtypes only

  // Waits until every step and operation has completed: the caller's memory
  // is then final. Throws the transport's and the device's errors.
  virtual void finish() = 0;

  // The codec operations of this kind of memory, or null where compressed
  // collectives do not run on it.
  virtual CodecOps* codec_ops() { return nullptr; }

  // exchange(plans), with `meanwhile` run while its messages travel: local
  // operations on memory the plans neither send nor receive. `meanwhile` may
  // call poke() between pieces of its work, so that the messages keep moving
  // where progress is driven by the waiting thread (TCP). By default it runs
  // first, then the exchange: the same result, without the overlap.
  virtual void exchange_while(const std::vector<StepPlan>& plans,
                              const std::function<void()>& meanwhile) {
    meanwhile();
    exchange(plans);
  }
  // Moves whatever messages can move now, without blocking.
  virtual void poke() {}
  // exchange(plans) of host memory, whatever memory the executor runs on,
  // cut into the same messages (a compressed call's canary rows).
  virtual void host_exchange(const std::vector<StepPlan>& plans) { exchange(plans); }
};

}  // namespace rr
