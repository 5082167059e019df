// The executor for device memory (a GPU's), which the transport cannot touch:
// every segment is moved through host staging memory by a Device (device.h),
// and reductions run on the device. Terms as in algorithms/ring_schedule.h
// (chunk, step, segment), plus:
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
// freely. Local operations (copy, reduce, divide) go on the kToDevice lane,
// so the next step's copies out see them.
#pragma once

#include <cstddef>

#include "executor/device.h"
#include "executor/executor.h"

namespace rr {

class DeviceExecutor final : public Executor {
 public:
  static constexpr size_t kSlots = 3;

  // Makes the lanes wait for the caller's stream (`mark`) and takes the
  // staging memory, with setup.scratch_bytes of device scratch.
  DeviceExecutor(const ExecutorSetup& setup, Device& device, const StreamMark& mark);
  // After an error: drains the lanes, so no queued copy writes the caller's
  // memory once the collective has failed.
  ~DeviceExecutor() override;
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  char* scratch() override { return scratch_; }
  void step(const StepPlan& plan) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, size_t n) override;
  void divide(void* data, size_t n, int divisor) override;
  // Waits for the sends in flight and for both lanes: the caller's memory is
  // final when it returns.
  void finish() override;

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

  ExecutorSetup setup_;
  Transport& transport_;
  Device& device_;
  size_t elem_;
  size_t segment_bytes_;
  SendSlot send_[kSlots];
  RecvSlot recv_[kSlots];
  char* scratch_ = nullptr;
  StepPlan plan_;  // the step in progress
  size_t send_segments_ = 0;
  size_t recv_segments_ = 0;
  bool finished_ = false;
};

}  // namespace rr
