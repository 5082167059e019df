// The staged pipeline: ring steps for memory the transport cannot touch (a
// GPU's), moved through host staging memory by a Device (device.h). Terms as
// in ring_schedule.h (chunk, step, segment), plus:
//   slot - a segment-sized piece of staging memory. Each direction has kSlots
//          of them, used round robin, so that while segment j is on the wire,
//          segments j+1 and j+2 are already being copied off the device, and
//          segment j-1 is being copied onto it and reduced.
//
// For each segment j of a step:
//   going out: device -> send slot (kToHost lane); once there, isend.
//   coming in: irecv -> recv slot; once arrived, recv slot -> device slot and
//              a reduce kernel into place (kToDevice lane), or recv slot ->
//              straight into place when there is nothing to reduce.
// A slot is reused only once what last used it has finished: the isend of a
// send slot; the copy to the device (and the forward, in broadcast) of a recv
// slot. The host waits on the device only for things queued a segment or
// more earlier, so copies, kernels and the network overlap.
//
// Between steps, the copies out wait for everything queued on the way in
// (the chunk sent in step t+1 is the one reduced in step t). Inside a step the
// chunk sent and the chunk received are different chunks, so the lanes run
// freely.
#pragma once

#include <cstddef>

#include "algorithms/collective.h"
#include "algorithms/device.h"

namespace rr {

// One step: send one chunk to the right while receiving one from the left.
// Either may be empty (a zero-element chunk is not sent at all, on both sides).
struct StepPlan {
  const char* send = nullptr;  // device address of the chunk to send
  size_t send_bytes = 0;
  char* recv = nullptr;  // device address where the received chunk goes
  size_t recv_bytes = 0;
  // When set, the received chunk is reduced: recv = reduce_with op received.
  const char* reduce_with = nullptr;
  // Also send each received segment on to the right, straight from its slot.
  bool forward = false;
};

class StagedPipeline {
 public:
  static constexpr size_t kSlots = 3;

  // Makes the lanes wait for the caller's stream (ctx.device_mark) and takes
  // the staging memory, with `scratch_bytes` of device scratch.
  StagedPipeline(RingContext& ctx, DataType dtype, ReduceOp op, size_t scratch_bytes);
  // After an error: drains the lanes, so no queued copy writes the caller's
  // memory once the collective has failed.
  ~StagedPipeline();
  StagedPipeline(const StagedPipeline&) = delete;
  StagedPipeline& operator=(const StagedPipeline&) = delete;

  // Device work between steps (a division, a device-to-device copy) goes on
  // the kToDevice lane, so the next step's copies out see it.
  Device& device() { return device_; }
  char* scratch() const { return scratch_; }

  void step(const StepPlan& plan);

  // Waits for the sends in flight and for both lanes: the caller's memory is
  // final when it returns.
  void finish();

 private:
  struct SendSlot {
    char* host = nullptr;
    RequestPtr send;  // the isend reading this slot
  };
  struct RecvSlot {
    char* host = nullptr;
    char* device = nullptr;
    RequestPtr recv;     // the irecv writing this slot
    RequestPtr forward;  // the isend forwarding it (broadcast)
  };

  size_t length(size_t total, size_t j) const;
  void stage_send(size_t j);
  void send_staged(size_t j);
  void post_recv(size_t j);
  void land(size_t j);

  RingContext& ctx_;
  Transport& transport_;
  Device& device_;
  DataType dtype_;
  ReduceOp op_;
  size_t elem_;
  size_t segment_bytes_;
  int left_;
  int right_;
  SendSlot send_[kSlots];
  RecvSlot recv_[kSlots];
  char* scratch_ = nullptr;
  StepPlan plan_;  // the step in progress
  size_t send_segments_ = 0;
  size_t recv_segments_ = 0;
  bool finished_ = false;
};

}  // namespace rr
