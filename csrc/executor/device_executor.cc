#include "executor/device_executor.h"

#include <algorithm>

#include "algorithms/ring_schedule.h"
#include "common/error.h"

namespace rr {
namespace {

// Segments j+1 .. j+kLookahead are staged while segment j is on the wire.
constexpr size_t kLookahead = DeviceExecutor::kSlots - 1;

// Events: slot k's copy off the device is done (kSendStaged + k); slot k's
// copy onto the device is done (kRecvLanded + k); a step has begun.
constexpr int kSendStaged = 0;
constexpr int kRecvLanded = DeviceExecutor::kSlots;
constexpr int kStepBegins = 2 * DeviceExecutor::kSlots;
static_assert(kStepBegins < Device::kEvents, "the pipeline uses more events than a Device has");

int slot_event(int base, size_t j) { return base + static_cast<int>(j % DeviceExecutor::kSlots); }

}  // namespace

DeviceExecutor::DeviceExecutor(const ExecutorSetup& setup, Device& device, const StreamMark& mark)
    : setup_(setup),
      transport_(setup.transport),
      device_(device),
      elem_(dtype_size(setup.dtype)),
      segment_bytes_(segment_size(setup.segment_bytes, elem_)) {
  device_.begin(mark);
  const Staging staging = device_.staging(kSlots, segment_bytes_, setup.scratch_bytes);
  for (size_t k = 0; k < kSlots; ++k) {
    send_[k].host = staging.send_host + k * staging.slot_stride;
    recv_[k].host = staging.recv_host + k * staging.slot_stride;
    recv_[k].device = staging.recv_device + k * staging.slot_stride;
  }
  scratch_ = staging.scratch;
}

DeviceExecutor::~DeviceExecutor() {
  if (finished_) return;
  try {
    device_.finish(setup_.deadline());
  } catch (...) {
    // Already failing: the first error is the one to report.
  }
}

size_t DeviceExecutor::length(size_t total, size_t j) const {
  return std::min(segment_bytes_, total - j * segment_bytes_);
}

void DeviceExecutor::step(const StepPlan& plan) {
  if (plan.forward && plan.reduce_with != nullptr) {
    throw Error("device executor: a step cannot both reduce and forward");
  }
  plan_ = plan;
  send_segments_ = segments_in(plan.send_bytes, segment_bytes_);
  recv_segments_ = segments_in(plan.recv_bytes, segment_bytes_);
  // The chunk sent now may be the one the previous step received and reduced.
  device_.record(Lane::kToDevice, kStepBegins);
  device_.lane_wait(Lane::kToHost, kStepBegins);

  for (size_t j = 0; j < kLookahead; ++j) {
    stage_send(j);
    post_recv(j);
  }
  // Each iteration posts the send of segment j before it waits on the network,
  // as every rank does: the left neighbour's segment j is always on its way.
  for (size_t j = 0; j < std::max(send_segments_, recv_segments_); ++j) {
    send_staged(j);
    post_recv(j + kLookahead);
    land(j);
    stage_send(j + kLookahead);
  }
}

// Queues the copy of send segment j off the device into its slot.
void DeviceExecutor::stage_send(size_t j) {
  if (j >= send_segments_) return;
  SendSlot& slot = send_[j % kSlots];
  if (slot.send) {
    // Segment j - kSlots is still being read from this slot by the transport.
    transport_.wait(*slot.send, setup_.deadline());
    slot.send.reset();
  }
  device_.copy(Lane::kToHost, slot.host, plan_.send + j * segment_bytes_,
               length(plan_.send_bytes, j));
  device_.record(Lane::kToHost, slot_event(kSendStaged, j));
}

// Sends segment j once its copy off the device (queued kLookahead segments
// ago) is done.
void DeviceExecutor::send_staged(size_t j) {
  if (j >= send_segments_) return;
  SendSlot& slot = send_[j % kSlots];
  device_.sync(slot_event(kSendStaged, j), setup_.deadline());
  slot.send = transport_.isend(plan_.send_to, slot.host, length(plan_.send_bytes, j));
}

// Posts the receive of segment j into its slot, once the slot's previous
// segment has left it.
void DeviceExecutor::post_recv(size_t j) {
  if (j >= recv_segments_) return;
  RecvSlot& slot = recv_[j % kSlots];
  if (slot.forward) {
    transport_.wait(*slot.forward, setup_.deadline());
    slot.forward.reset();
  }
  device_.sync(slot_event(kRecvLanded, j), setup_.deadline());
  slot.recv = transport_.irecv(plan_.recv_from, slot.host, length(plan_.recv_bytes, j));
}

// Waits for segment j and queues its way onto the device.
void DeviceExecutor::land(size_t j) {
  if (j >= recv_segments_) return;
  RecvSlot& slot = recv_[j % kSlots];
  const size_t bytes = length(plan_.recv_bytes, j);
  transport_.wait(*slot.recv, setup_.deadline());
  slot.recv.reset();
  if (plan_.forward) slot.forward = transport_.isend(plan_.send_to, slot.host, bytes);
  char* dst = plan_.recv + j * segment_bytes_;
  if (plan_.reduce_with == nullptr) {
    device_.copy(Lane::kToDevice, dst, slot.host, bytes);
    device_.record(Lane::kToDevice, slot_event(kRecvLanded, j));
    return;
  }
  // The host slot is free once the copy is done; the device slot is reused
  // only by later work on the same lane, which runs after this kernel.
  device_.copy(Lane::kToDevice, slot.device, slot.host, bytes);
  device_.record(Lane::kToDevice, slot_event(kRecvLanded, j));
  device_.reduce(Lane::kToDevice, setup_.dtype, setup_.op, dst,
                 plan_.reduce_with + j * segment_bytes_, slot.device, bytes / elem_);
  if (plan_.divide_by > 1) {
    device_.divide(Lane::kToDevice, setup_.dtype, dst, bytes / elem_, plan_.divide_by);
  }
}

void DeviceExecutor::finish() {
  for (SendSlot& slot : send_) {
    if (slot.send) transport_.wait(*slot.send, setup_.deadline());
    slot.send.reset();
  }
  for (RecvSlot& slot : recv_) {
    if (slot.forward) transport_.wait(*slot.forward, setup_.deadline());
    slot.forward.reset();
  }
  device_.finish(setup_.deadline());
  finished_ = true;
}

void DeviceExecutor::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) device_.copy(Lane::kToDevice, dst, src, bytes);
}

void DeviceExecutor::reduce(void* out, const void* a, const void* b, size_t n) {
  if (n > 0) device_.reduce(Lane::kToDevice, setup_.dtype, setup_.op, out, a, b, n);
}

void DeviceExecutor::divide(void* data, size_t n, int divisor) {
  if (n > 0) device_.divide(Lane::kToDevice, setup_.dtype, data, n, divisor);
}

}  // namespace rr
