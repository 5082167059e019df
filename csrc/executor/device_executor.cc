#include "executor/device_executor.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "executor/segments.h"

namespace rr {
namespace {

constexpr size_t kLookahead = DeviceExecutor::kLookahead;

// Events: slot k's copy off the device is done (kSendStaged + k); slot k's
// copy onto the device is done (kRecvLanded + k); a step has begun.
constexpr int kSendStaged = 0;
constexpr int kRecvLanded = DeviceExecutor::kSlots;
constexpr int kStepBegins = 2 * DeviceExecutor::kSlots;
// The codec's operations have all run (DeviceCodecOps::settle).
constexpr int kSettled = kStepBegins + 1;
// View n's copy onto the device is done (kViewLanded + n % kMaxViews): at most
// kMaxViews are held, so an event is recorded again only after its view went back.
constexpr int kViewLanded = kSettled + 1;
static_assert(kViewLanded + Transport::kMaxViews <= Device::kEvents,
              "the pipeline uses more events than a Device has");

int slot_event(int base, size_t b) { return base + static_cast<int>(b % DeviceExecutor::kSlots); }

// Calls fn(offset, length) for each segment of a batch of `bytes`.
template <typename Fn>
void for_segments(size_t bytes, size_t segment, Fn fn) {
  for (size_t at = 0; at < bytes; at += segment) fn(at, std::min(segment, bytes - at));
}

}  // namespace

DeviceExecutor::DeviceExecutor(const ExecutorSetup& setup, Device& device, const StreamMark& mark)
    : setup_(setup),
      transport_(setup.transport),
      device_(device),
      elem_(dtype_size(setup.dtype)),
      segment_bytes_(segment_size(setup.segment_bytes, elem_)),
      slot_segments_(std::max<size_t>(1, setup.staging_bytes / segment_bytes_)) {
  device_.begin(mark);
  const Staging staging =
      device_.staging(kSlots, slot_segments_ * segment_bytes_, setup.scratch_bytes);
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

size_t DeviceExecutor::length(size_t total, size_t b) const {
  return std::min(batch_bytes_, total - b * batch_bytes_);
}

void DeviceExecutor::wait_all(std::vector<RequestPtr>& requests) {
  for (const RequestPtr& request : requests) transport_.wait(*request, setup_.deadline());
  requests.clear();
}

void DeviceExecutor::step(const StepPlan& plan) {
  if (plan.forward && plan.reduce_with != nullptr) {
    throw Error("device executor: a step cannot both reduce and forward");
  }
  plan_ = plan;
  in_place_ = setup_.land_in_place && !plan.forward && plan.recv_bytes > 0 &&
              lockable(transport_.view_region(plan.recv_from, segment_bytes_));
  lend_ =
      setup_.land_in_place && plan.send_bytes > 0 && lockable(transport_.lend_region(plan.send_to));
  const size_t segments = segments_in(std::max(plan.send_bytes, plan.recv_bytes), segment_bytes_);
  // Landing in place holds a view per segment until its copy has run: one
  // segment per batch keeps the views of the batches in flight within what
  // the transport lends. A lent slot holds one segment.
  batch_bytes_ =
      in_place_ || lend_
          ? segment_bytes_
          : std::clamp<size_t>(segments / kBatchesPerStep, 1, slot_segments_) * segment_bytes_;
  send_batches_ = segments_in(plan.send_bytes, batch_bytes_);
  recv_batches_ = segments_in(plan.recv_bytes, batch_bytes_);
  // The chunk sent now may be the one the previous step received and reduced.
  device_.record(Lane::kToDevice, kStepBegins);
  device_.lane_wait(Lane::kToHost, kStepBegins);

  for (size_t b = 0; b < kLookahead; ++b) {
    stage_send(b);
    post_recv(b);
  }
  // Each iteration posts the sends of batch b before it waits on the network,
  // as every rank does: the left neighbour's batch b is always on its way.
  for (size_t b = 0; b < std::max(send_batches_, recv_batches_); ++b) {
    send_staged(b);
    post_recv(b + kLookahead);
    land(b);
    stage_send(b + kLookahead);
  }
}

bool DeviceExecutor::lockable(const MemoryRange& inbox) {
  return inbox.bytes > 0 && device_.lock_host(inbox.data, inbox.bytes);
}

void DeviceExecutor::release_oldest_view() {
  HeldView& oldest = held_.front();
  device_.sync(kViewLanded + static_cast<int>(oldest.number % Transport::kMaxViews),
               setup_.deadline());
  transport_.release(*oldest.view);
  held_.pop_front();
}

// Queues the copy of send batch b off the device into its slot.
void DeviceExecutor::stage_send(size_t b) {
  if (b >= send_batches_) return;
  SendSlot& slot = send_[b % kSlots];
  wait_all(slot.sends);  // batch b - kSlots is still being read from this slot
  const size_t bytes = length(plan_.send_bytes, b);
  slot.lent = nullptr;
  slot.held_back = false;
  // Lent memory lies inside lend_region(), which step() locked whole.
  if (lend_ && held_back_ == 0) slot.lent = transport_.lend(plan_.send_to, bytes);
  if (slot.lent == nullptr && lend_) {
    slot.held_back = true;
    ++held_back_;
  }
  char* staged = slot.lent != nullptr ? slot.lent : slot.host;
  device_.copy(Lane::kToHost, staged, plan_.send + b * batch_bytes_, bytes);
  device_.record(Lane::kToHost, slot_event(kSendStaged, b));
}

// Sends the segments of batch b once its copy off the device (queued
// kLookahead batches ago) is done.
void DeviceExecutor::send_staged(size_t b) {
  if (b >= send_batches_) return;
  SendSlot& slot = send_[b % kSlots];
  device_.sync(slot_event(kSendStaged, b), setup_.deadline());
  const size_t bytes = length(plan_.send_bytes, b);
  if (slot.lent != nullptr) {
    in_place_bytes_ += bytes;
    slot.sends.push_back(transport_.isend_lent(plan_.send_to, slot.lent, bytes));
    slot.lent = nullptr;
    return;
  }
  for_segments(bytes, segment_bytes_, [&](size_t at, size_t n) {
    slot.sends.push_back(transport_.isend(plan_.send_to, slot.host + at, n));
  });
  if (slot.held_back) {
    slot.held_back = false;
    --held_back_;
  }
}

// Posts the receives of batch b into its slot, once the slot's previous batch
// has left it.
void DeviceExecutor::post_recv(size_t b) {
  if (b >= recv_batches_) return;
  RecvSlot& slot = recv_[b % kSlots];
  wait_all(slot.forwards);
  device_.sync(slot_event(kRecvLanded, b), setup_.deadline());
  for_segments(length(plan_.recv_bytes, b), segment_bytes_, [&](size_t at, size_t n) {
    if (!in_place_) {
      slot.recvs.push_back(transport_.irecv(plan_.recv_from, slot.host + at, n));
      return;
    }
    if (held_.size() + views_posted_ >= static_cast<size_t>(Transport::kMaxViews)) {
      if (held_.empty()) throw Error("device executor: more views posted than a transport lends");
      release_oldest_view();
    }
    slot.recvs.push_back(transport_.irecv_view(plan_.recv_from, n));
    ++views_posted_;
  });
}

// Waits for the segments of batch b (forwarding each as it comes, in
// broadcast) and queues the batch's way onto the device.
void DeviceExecutor::land(size_t b) {
  if (b >= recv_batches_) return;
  RecvSlot& slot = recv_[b % kSlots];
  const size_t bytes = length(plan_.recv_bytes, b);
  for (size_t i = 0; i < slot.recvs.size(); ++i) {
    transport_.wait(*slot.recvs[i], setup_.deadline());
    if (plan_.forward) {
      const size_t at = i * segment_bytes_;
      slot.forwards.push_back(
          transport_.isend(plan_.send_to, slot.host + at, std::min(segment_bytes_, bytes - at)));
    }
  }
  char* dst = plan_.recv + b * batch_bytes_;
  // Without a reduction the bytes go straight into place; with one, into the
  // device slot the kernel reads. The host slot is free once the copy is
  // done; the device slot is reused only by later work on the same lane,
  // which runs after this kernel.
  char* landing = plan_.reduce_with == nullptr ? dst : slot.device;
  if (in_place_) {
    for (size_t i = 0; i < slot.recvs.size(); ++i) {
      const size_t at = i * segment_bytes_;
      const size_t n = std::min(segment_bytes_, bytes - at);
      const char* view = slot.recvs[i]->view();
      if (device_.host_locked(view, n)) {
        device_.copy(Lane::kToDevice, landing + at, view, n);
        in_place_bytes_ += n;
      } else {
        std::memcpy(slot.host + at, view, n);
        device_.copy(Lane::kToDevice, landing + at, slot.host + at, n);
      }
      const uint64_t number = views_taken_++;
      device_.record(Lane::kToDevice,
                     kViewLanded + static_cast<int>(number % Transport::kMaxViews));
      held_.push_back({slot.recvs[i], number});
      --views_posted_;
    }
  } else {
    device_.copy(Lane::kToDevice, landing, slot.host, bytes);
  }
  slot.recvs.clear();
  device_.record(Lane::kToDevice, slot_event(kRecvLanded, b));
  if (plan_.reduce_with == nullptr) return;
  device_.reduce(Lane::kToDevice, setup_.dtype, setup_.op, dst,
                 plan_.reduce_with + b * batch_bytes_, slot.device, bytes / elem_);
  if (plan_.divide_by > 1) {
    device_.divide(Lane::kToDevice, setup_.dtype, dst, bytes / elem_, plan_.divide_by);
  }
}

void DeviceExecutor::finish() {
  for (SendSlot& slot : send_) wait_all(slot.sends);
  for (RecvSlot& slot : recv_) wait_all(slot.forwards);
  device_.finish(setup_.deadline());
  for (HeldView& held : held_) transport_.release(*held.view);  // oldest first
  held_.clear();
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

void DeviceExecutor::host_exchange(const std::vector<StepPlan>& plans) {
  std::vector<RequestPtr> sends, recvs;
  for (const StepPlan& plan : plans) {
    for_segments(plan.send_bytes, segment_bytes_, [&](size_t at, size_t n) {
      sends.push_back(transport_.isend(plan.send_to, plan.send + at, n));
    });
    for_segments(plan.recv_bytes, segment_bytes_, [&](size_t at, size_t n) {
      recvs.push_back(transport_.irecv(plan.recv_from, plan.recv + at, n));
    });
  }
  wait_all(recvs);
  wait_all(sends);
}

// ---- the codec's operations, queued on the kToDevice lane ----

void DeviceExecutor::DeviceCodecOps::encode(codec::CodecKind kind, const float* v, float* residual,
                                            bool residual_out_only, size_t n, uint64_t key,
                                            uint8_t* payload, uint64_t first) {
  if (n > 0) {
    x_.device_.encode(Lane::kToDevice, kind, v, residual, residual_out_only, n, key, payload,
                      first);
  }
}

void DeviceExecutor::DeviceCodecOps::decode(codec::CodecKind kind, const uint8_t* payload, size_t n,
                                            float* out) {
  if (n > 0) x_.device_.decode(Lane::kToDevice, kind, payload, n, out);
}

void DeviceExecutor::DeviceCodecOps::decode_add(codec::CodecKind kind,
                                                const uint8_t* const* payloads, size_t count,
                                                size_t n, float* acc) {
  // One payload at a time, in order: the same additions as the CPU loop's.
  for (size_t j = 0; j < count && n > 0; ++j) {
    x_.device_.decode_add(Lane::kToDevice, kind, payloads[j], 0, 1, n, acc);
  }
}

void DeviceExecutor::DeviceCodecOps::convert(DataType to, void* dst, DataType from, const void* src,
                                             size_t n) {
  if (n == 0) return;
  if (to == DataType::kFloat32 && from == DataType::kFloat32) {
    if (dst != src) x_.device_.copy(Lane::kToDevice, dst, src, n * sizeof(float));
    return;
  }
  x_.device_.convert(Lane::kToDevice, to, dst, from, src, n);
}

void DeviceExecutor::DeviceCodecOps::add(float* out, const float* a, const float* b, size_t n) {
  if (n > 0) {
    x_.device_.reduce(Lane::kToDevice, DataType::kFloat32, ReduceOp::kSum, out, a, b, n);
  }
}

void DeviceExecutor::DeviceCodecOps::divide(float* data, size_t n, int divisor) {
  if (n > 0) x_.device_.divide(Lane::kToDevice, DataType::kFloat32, data, n, divisor);
}

void DeviceExecutor::DeviceCodecOps::zero(float* data, size_t n) {
  if (n > 0) x_.device_.zero(Lane::kToDevice, data, n * sizeof(float));
}

void DeviceExecutor::DeviceCodecOps::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) x_.device_.copy(Lane::kToDevice, dst, src, bytes);
}

void DeviceExecutor::DeviceCodecOps::settle() {
  x_.device_.record(Lane::kToDevice, kSettled);
  x_.device_.sync(kSettled, x_.setup_.deadline());
}

}  // namespace rr
