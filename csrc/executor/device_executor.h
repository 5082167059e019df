// The executor for device memory (a GPU's), which the transport cannot touch:
// every segment is moved through host staging memory by a Device (device.h),
// and reductions run on the device. Terms as in algorithms/ring_schedule.h
// (chunk, step, segment), plus:
//   batch - consecutive segments of a step that cross between device and host
//           in one copy: one copy, one event and one reduce kernel per batch
//           instead of per segment. The wire still carries segments (the
//           messages both ends agree on), so a device rank and a host rank
//           still meet in one collective. A step is cut into about
//           kBatchesPerStep batches, each at most the slot size.
//   slot  - a batch-sized piece of staging memory (setup.staging_bytes, at
//           least a segment). Each direction has kSlots of them, used round
//           robin, so that while batch b is on the wire, batches b+1 and b+2
//           are already being copied off the device, and batch b-1 is being
//           copied onto it and reduced.
//
// For each batch b of a step:
//   going out: device -> send slot (kToHost lane); once there, an isend per
//              segment.
//   coming in: an irecv per segment -> recv slot; once all arrived, recv
//              slot -> device slot and one reduce kernel into place
//              (kToDevice lane), or recv slot -> straight into place when
//              there is nothing to reduce.
// A slot is reused only once what last used it has finished: the isends of a
// send slot; the copy to the device (and the forwards, in broadcast) of a recv
// slot. With kSlots = kLookahead + 2, those were queued two batches earlier,
// so the host seldom waits on the device: copies, kernels and the network
// overlap.
//
// Landing in place (ExecutorSetup::land_in_place: RINGREDUCE_DEVICE_IN_PLACE=1,
// off by default until a GPU has measured it; see below). Where the transport
// lends views of a step's messages in
// memory of its own that the device can page-lock (Transport::view_region:
// shared memory's inbox), the step receives views instead, and the copies
// onto the device read the messages where the sender wrote them: one host
// copy per byte received fewer (the transport's copy out of its inbox into
// the recv slot). A view holds its inbox slot until its copy has run, and a
// transport lends only Transport::kMaxViews at once, so such a step moves one
// segment per batch, and a view goes back once the copy that read it has
// passed (its event), oldest first, before the next is posted. A view that
// turns out not to lie in locked memory (a peer sending by address after
// all) is copied into the recv slot first, as before. Forwarding steps
// (broadcast) keep the recv slots. The choice is this rank's alone: the wire
// carries the same segments either way.
//
// Sending in place is the mirror image: where the transport lends the memory
// a message will travel in (Transport::lend: the next slot of the peer's
// inbox) inside a range the device can page-lock, the copy off the device
// writes the segment straight into that slot, and isend_lent() publishes it
// once the copy has run: no host copy at all between the two GPUs' copies.
// Lent slots are posted in the order they were lent, so once a segment has
// had to go through a send slot (no slot free), nothing more is lent until
// its isend is posted.
//
// The price: both ways move one segment per copy and wait for each, where the
// slots above move batches. The inboxes are shallow (a few segments per peer),
// so the pipeline is as deep as they are. Under MPS or with a GPU per rank a
// wait costs microseconds; where ranks time-slice one GPU it can cost a time
// slice, which is what made per-segment staging 4x slower than batches.
//
// Between steps, the copies out wait for everything queued on the way in
// (the chunk sent in step t+1 is the one reduced in step t). Inside a step the
// chunk sent and the chunk received are different chunks, so the lanes run
// freely. Local operations (copy, reduce, divide) go on the kToDevice lane,
// so the next step's copies out see them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "executor/device.h"
#include "executor/executor.h"

namespace rr {

class DeviceExecutor final : public Executor {
 public:
  static constexpr size_t kLookahead = 2;  // batches staged ahead of the one on the wire
  static constexpr size_t kSlots = kLookahead + 2;
  static constexpr size_t kBatchesPerStep = 4;

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
  // The codec's operations as the Device's kernels, on the kToDevice lane
  // (after the data that lane lands, before the next step's copies out).
  CodecOps* codec_ops() override { return &codec_; }
  // Bytes copied between the device and the transport's own memory directly
  // so far (landing and sending in place).
  uint64_t in_place_bytes() const { return in_place_bytes_; }
  // Host memory: the transport's own messages, cut into segments as a host
  // rank cuts them.
  void host_exchange(const std::vector<StepPlan>& plans) override;

 private:
  class DeviceCodecOps final : public CodecOps {
   public:
    explicit DeviceCodecOps(DeviceExecutor& x) : x_(x) {}
    void encode(codec::CodecKind kind, const float* v, float* residual, bool residual_out_only,
                size_t n, uint64_t key, uint8_t* payload, uint64_t first) override;
    void decode(codec::CodecKind kind, const uint8_t* payload, size_t n, float* out) override;
    void decode_add(codec::CodecKind kind, const uint8_t* const* payloads, size_t count, size_t n,
                    float* acc) override;
    void convert(DataType to, void* dst, DataType from, const void* src, size_t n) override;
    void add(float* out, const float* a, const float* b, size_t n) override;
    void divide(float* data, size_t n, int divisor) override;
    void zero(float* data, size_t n) override;
    void to_host(void* dst, const void* src, size_t bytes) override;
    void settle() override;

   private:
    DeviceExecutor& x_;
  };

  struct SendSlot {
    char* host = nullptr;
    std::vector<RequestPtr> sends;  // the isends reading this slot, one per segment
    // Sending in place: the batch's one segment goes in this lent memory (the
    // copy off the device writes it there).
    char* lent = nullptr;
    bool held_back = false;  // through `host` while in place: nothing is lent until posted
  };
  struct RecvSlot {
    char* host = nullptr;
    char* device = nullptr;
    std::vector<RequestPtr> recvs;     // the irecvs writing this slot
    std::vector<RequestPtr> forwards;  // the isends forwarding it (broadcast)
  };

  struct HeldView {
    RequestPtr view;
    uint64_t
        number;  // of the views this executor took: its event is kViewLanded + number % kMaxViews
  };

  size_t length(size_t total, size_t b) const;  // of batch b of a region of `total` bytes
  void wait_all(std::vector<RequestPtr>& requests);
  // Whether the device copies straight to or from this memory of the
  // transport's (view_region: landing in place; lend_region: sending in
  // place): it page-locks it, once.
  bool lockable(const MemoryRange& inbox);
  // Gives back the oldest held view once the copy that read it has run.
  void release_oldest_view();
  void stage_send(size_t b);
  void send_staged(size_t b);
  void post_recv(size_t b);
  void land(size_t b);

  ExecutorSetup setup_;
  Transport& transport_;
  Device& device_;
  size_t elem_;
  size_t segment_bytes_;
  size_t slot_segments_;    // segments a slot holds
  size_t batch_bytes_ = 0;  // of the step in progress: a whole number of segments
  SendSlot send_[kSlots];
  RecvSlot recv_[kSlots];
  char* scratch_ = nullptr;
  StepPlan plan_;  // the step in progress
  size_t send_batches_ = 0;
  size_t recv_batches_ = 0;
  bool in_place_ = false;      // the step in progress lands in place
  bool lend_ = false;          // the step in progress sends in place
  size_t held_back_ = 0;       // batches through send slots while sending in place, not posted
  std::deque<HeldView> held_;  // views whose copies are queued, oldest first
  size_t views_posted_ = 0;    // views posted, not yet landed
  uint64_t views_taken_ = 0;   // views posted so far, in all steps
  uint64_t in_place_bytes_ = 0;
  bool finished_ = false;
  DeviceCodecOps codec_{*this};
};

}  // namespace rr
