// The CPU emulation of a Device, so that the staged pipeline (the very code
// that moves CUDA arrays) is tested on machines without a GPU. "Device"
// memory is host memory; copies are memcpy and reductions the CPU kernels.
//
// The emulation is adversarial about timing. Work queued on a lane mostly runs
// only when the pipeline asks for it: sync() of an event recorded after it, a
// lane that must wait for it, or finish(). A real GPU runs it at some point in
// between; running it as late as allowed turns every missing sync or lane
// wait into stale data, which the tests compare against numpy. Now and then,
// though, a lane runs ahead (which a GPU may also do), so that a lane writing
// memory another lane has yet to read shows up as well. Staging memory is
// poisoned at every call, so reading a slot before its copy ran shows too.
//
// Shared allocations (device windows) are shared-memory segments, and their
// handles the segments' records, so the ranks' processes map each other's
// "device" memory as CUDA IPC maps a GPU's: the whole window protocol runs
// without a GPU.
//
// The callers' streams are emulated too: tests queue writes on a stream
// handle (fake_stream_write), standing for work the caller queued before its
// call. They run as late as allowed as well: only when a collective that
// marked the stream runs its first operation, syncs or finishes, or when the
// test syncs the stream. A collective that touches its buffers, or lets a
// peer touch them, before waiting for its caller's stream sees stale data.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/page_lock.h"
#include "executor/devices.h"
#include "kernels/codec.h"
#include "kernels/codec_scalar.h"
#include "reduce/cpu_kernels.h"
#include "reduce/half.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_window.h"

namespace rr {
namespace {

constexpr unsigned char kPoison = 0xA5;

// Work queued on the callers' streams, by stream handle, for the process.
class CallerStreams {
 public:
  static CallerStreams& get() {
    static CallerStreams* streams = new CallerStreams;  // never destroyed: used at exit
    return *streams;
  }
  void queue(uintptr_t stream, std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& s = streams_[stream];
    s.ops.push_back(std::move(op));
  }
  uint64_t queued(uintptr_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const Stream& s = streams_[stream];
    return s.ran + s.ops.size();
  }
  // Runs the stream's work up to its position-th operation.
  void run_until(uintptr_t stream, uint64_t position) {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& s = streams_[stream];
    while (s.ran < position) {
      std::function<void()> op = std::move(s.ops.front());
      s.ops.pop_front();
      ++s.ran;
      op();
    }
  }

 private:
  struct Stream {
    std::deque<std::function<void()>> ops;  // queued, not yet run
    uint64_t ran = 0;
  };
  std::mutex mu_;
  std::map<uintptr_t, Stream> streams_;
};

// A caller's stream as it was at the call: how much work it had queued.
struct FakeMark final : StreamMark {
  FakeMark(uintptr_t s, uint64_t p) : stream(s), position(p) {}
  uintptr_t stream;
  uint64_t position;
};

bool lock_nothing(void*, size_t) { return true; }
void unlock_nothing(void*) noexcept {}
// One queued operation in kEagerOneIn runs a lane ahead.
constexpr uint32_t kEagerOneIn = 8;

class FakeDevice final : public Device {
 public:
  explicit FakeDevice(int device) : device_(device) {}

  std::shared_ptr<StreamMark> mark(uintptr_t stream) override {
    return std::make_shared<FakeMark>(stream, CallerStreams::get().queued(stream));
  }

  void begin(const StreamMark& mark) override {
    if (!lanes_[0].empty() || !lanes_[1].empty()) {
      throw Error("fake device: an earlier collective left work queued (a missing finish)");
    }
    const auto* m = dynamic_cast<const FakeMark*>(&mark);
    if (m == nullptr) throw Error("fake device: a stream mark another device made");
    caller_ = *m;
    caller_pending_ = true;
  }

  Staging staging(size_t slots, size_t slot_bytes, size_t scratch_bytes) override {
    for (std::vector<char>* v : {&send_host_, &recv_host_, &recv_device_}) {
      v->assign(slots * slot_bytes, static_cast<char>(kPoison));
    }
    scratch_.assign(scratch_bytes, static_cast<char>(kPoison));
    return {send_host_.data(), recv_host_.data(), recv_device_.data(), scratch_.data(), slot_bytes};
  }

  void copy(Lane lane, void* dst, const void* src, size_t bytes) override {
    const char* d = static_cast<const char*>(dst);
    const char* s = static_cast<const char*>(src);
    // cudaMemcpyAsync leaves overlapping copies undefined; here they fail.
    if (bytes > 0 && d < s + bytes && s < d + bytes) {
      throw Error("fake device: overlapping copy of " + std::to_string(bytes) + " bytes");
    }
    enqueue(lane, [=] { std::memcpy(dst, src, bytes); });
  }

  void reduce(Lane lane, DataType dtype, ReduceOp op, void* out, const void* a, const void* b,
              size_t n) override {
    const ReduceFn fn = cpu_reduce_fn(dtype, op);
    enqueue(lane, [=] { fn(out, a, b, n); });
  }

  void divide(Lane lane, DataType dtype, void* data, size_t n, int divisor) override {
    enqueue(lane, [=] { divide_by(dtype, data, n, divisor); });
  }

  void reduce_all(Lane lane, DataType dtype, ReduceOp op, const void* const* in, int count,
                  void* const* out, int outputs, size_t n, int divisor) override {
    if (count < 1 || count > kMaxReduceAll || outputs < 0 || outputs > kMaxReduceAll) {
      throw Error("fake device: reduce_all of " + std::to_string(count) + " inputs into " +
                  std::to_string(outputs) + " outputs");
    }
    if (outputs == 0 || n == 0) return;
    std::vector<const void*> inputs(in, in + count);
    std::vector<void*> outs(out, out + outputs);
    const size_t bytes = n * dtype_size(dtype);
    // Every input is read before any output is written, as the kernel reads
    // each element from every input before it writes it.
    enqueue(lane, [=] {
      std::vector<char> v(bytes);
      rr::reduce_all(dtype, op, inputs.data(), inputs.size(), v.data(), n, divisor);
      for (void* o : outs) std::memcpy(o, v.data(), bytes);
    });
  }

  void* allocate(size_t bytes) override {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    if (p == nullptr) throw Error("fake device: out of memory for " + std::to_string(bytes));
    std::memset(p, kPoison, bytes);
    return p;
  }

  void release(void* ptr) override { std::free(ptr); }

  void encode(Lane lane, codec::CodecKind kind, const float* x, float* residual,
              bool residual_out_only, size_t n, uint64_t key, uint8_t* payload,
              uint64_t first) override {
    enqueue(lane, [=] {
      // The CPU loop adds the residual in: -0.0 leaves every value's bits as
      // they are (signed zeros too), so what it writes is x's residual alone.
      if (residual != nullptr && residual_out_only) std::fill(residual, residual + n, -0.0f);
      codec::encode(kind, x, residual, n, key, payload, first);
    });
  }

  void decode(Lane lane, codec::CodecKind kind, const uint8_t* payload, size_t n,
              float* out) override {
    enqueue(lane, [=] { codec::decode(kind, payload, n, out); });
  }

  void decode_add(Lane lane, codec::CodecKind kind, const uint8_t* payloads, size_t stride,
                  size_t count, size_t n, float* acc) override {
    enqueue(lane, [=] {
      std::vector<const uint8_t*> each(count);
      for (size_t j = 0; j < count; ++j) each[j] = payloads + j * stride;
      codec::decode_add(kind, each.data(), count, n, acc);
    });
  }

  void convert(Lane lane, DataType to, void* dst, DataType from, const void* src,
               size_t n) override {
    const bool widen = to == DataType::kFloat32;
    const DataType half = widen ? from : to;
    if ((half != DataType::kFloat16 && half != DataType::kBFloat16) ||
        (!widen && from != DataType::kFloat32)) {
      throw InvalidArgument("fake device: convert is between float32 and float16 or bfloat16");
    }
    const bool bf16 = half == DataType::kBFloat16;
    enqueue(lane, [=] {
      if (widen) {
        const uint16_t* s = static_cast<const uint16_t*>(src);
        float* d = static_cast<float*>(dst);
        for (size_t i = 0; i < n; ++i) d[i] = bf16 ? bfloat16_to_float(s[i]) : half_to_float(s[i]);
      } else {
        const float* s = static_cast<const float*>(src);
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (size_t i = 0; i < n; ++i) {
          d[i] = bf16 ? codec::to_bf16(s[i]) : codec::to_half_as_numpy(s[i]);
        }
      }
    });
  }

  void zero(Lane lane, void* ptr, size_t bytes) override {
    enqueue(lane, [=] { std::memset(ptr, 0, bytes); });
  }

  void* allocate_shared(size_t bytes, SharedHandle* handle) override {
    if (bytes == 0) throw InvalidArgument("fake device: a shared allocation needs a byte");
    // The window's layout: its header's pages, then the data.
    const size_t offset = SharedWindow::data_offset();
    shm::Segment segment = shm::Segment::create(offset + bytes);
    segment.reserve(offset, bytes, "for a device window");
    const shm::SegmentRecord record = segment.record();
    *handle = {};
    const uint64_t fields[5] = {static_cast<uint64_t>(record.pid),
                                static_cast<uint64_t>(static_cast<int64_t>(record.fd)),
                                record.inode, record.bytes, record.nonce};
    static_assert(sizeof fields <= sizeof handle->bytes, "a segment's record fits a handle");
    std::memcpy(handle->bytes, fields, sizeof fields);
    char* data = segment.base() + offset;
    std::lock_guard<std::mutex> lock(shared_mu_);
    shared_[data] = std::move(segment);  // its fd stays open: peers attach through it
    return data;
  }

  // Host memory needs no locking here; the registry still records it, so the
  // staged path takes its in-place route, and tests can count the ranges and
  // see them go with their mappings. RINGREDUCE_TEST_FAKE_PAGE_LOCK=0 emulates
  // a host whose memory the GPU cannot lock (the staged path's other route).
  bool lock_host(void* p, size_t bytes) override {
    const char* allowed = std::getenv("RINGREDUCE_TEST_FAKE_PAGE_LOCK");
    if (allowed != nullptr && std::string(allowed) == "0") return false;
    return page_lock::lock(p, bytes, &lock_nothing, &unlock_nothing);
  }

  bool host_locked(const void* p, size_t bytes) override {
    return page_lock::locked(p, bytes, &unlock_nothing);
  }

  void* map_shared(const SharedHandle& handle, size_t bytes, int peer, int peer_device) override {
    // Tests emulate GPUs without peer access between them.
    const char* access = std::getenv("RINGREDUCE_TEST_FAKE_PEER_ACCESS");
    if (peer_device != device_ && access != nullptr && std::string(access) == "0") {
      throw Error("fake device " + std::to_string(device_) + " has no peer access to device " +
                  std::to_string(peer_device) + ", where rank " + std::to_string(peer) +
                  "'s window is");
    }
    uint64_t fields[5];
    std::memcpy(fields, handle.bytes, sizeof fields);
    shm::SegmentRecord record;
    record.pid = static_cast<pid_t>(fields[0]);
    record.fd = static_cast<int>(static_cast<int64_t>(fields[1]));
    record.inode = fields[2];
    record.bytes = fields[3];
    record.nonce = fields[4];
    const size_t offset = SharedWindow::data_offset();
    if (record.bytes != offset + bytes) {
      throw Error("fake device: rank " + std::to_string(peer) + "'s shared allocation has " +
                  std::to_string(record.bytes) + " bytes, not the " +
                  std::to_string(offset + bytes) + " it published");
    }
    shm::Segment segment = shm::Segment::attach(record, record.bytes, peer);
    segment.close_fd();
    char* data = segment.base() + offset;
    std::lock_guard<std::mutex> lock(shared_mu_);
    shared_[data] = std::move(segment);
    return data;
  }

  void unmap_shared(void* mapped) noexcept override { release_shared(mapped); }

  void release_shared(void* ptr) noexcept override {
    std::lock_guard<std::mutex> lock(shared_mu_);
    shared_.erase(static_cast<char*>(ptr));  // unmaps it
  }

  void record(Lane lane, int event) override {
    const int i = static_cast<int>(lane);
    events_.at(event) = {i, queued_[i]};
  }

  void lane_wait(Lane lane, int event) override {
    // Like cudaStreamWaitEvent: the wait is for the event as recorded now.
    const Point point = events_.at(event);
    enqueue(lane, [this, point] { run_until(point); });
  }

  // Every event is recorded after begin(), which put the caller's stream
  // ahead of both lanes: reaching any means the caller's work has run.
  void sync(int event, const Deadline&) override {
    catch_up_with_caller();
    run_until(events_.at(event));
  }

  void finish(const Deadline&) override {
    catch_up_with_caller();
    for (int i = 0; i < 2; ++i) run_until({i, queued_[i]});
  }

 private:
  // A lane and how many of its operations must have run.
  struct Point {
    int lane = 0;
    uint64_t position = 0;
  };

  void enqueue(Lane lane, std::function<void()> op) {
    const int i = static_cast<int>(lane);
    lanes_[i].push_back(std::move(op));
    ++queued_[i];
    const int ahead = static_cast<int>(next_random() % 2);
    const uint64_t pending = queued_[ahead] - ran_[ahead];
    if (next_random() % kEagerOneIn == 0 && pending > 0) {
      run_until({ahead, ran_[ahead] + 1 + next_random() % pending});
    }
  }

  // xorshift32 with a fixed seed: the same call sequence, the same schedule.
  uint32_t next_random() {
    random_ ^= random_ << 13;
    random_ ^= random_ >> 17;
    random_ ^= random_ << 5;
    return random_;
  }

  // Both lanes wait for the caller's stream as it was at the call.
  void catch_up_with_caller() {
    if (!caller_pending_) return;
    caller_pending_ = false;
    CallerStreams::get().run_until(caller_.stream, caller_.position);
  }

  void run_until(const Point& point) {
    std::deque<std::function<void()>>& lane = lanes_[point.lane];
    if (ran_[point.lane] < point.position) catch_up_with_caller();
    while (ran_[point.lane] < point.position) {
      std::function<void()> op = std::move(lane.front());
      lane.pop_front();
      // Counted before it runs: a wait inside it never waits for itself.
      ++ran_[point.lane];
      op();
    }
  }

  int device_;  // the CUDA device it stands in for
  FakeMark caller_{0, 0};        // the caller's stream of the collective in progress
  bool caller_pending_ = false;  // its work up to the mark has yet to run
  std::deque<std::function<void()>> lanes_[2];
  uint64_t queued_[2] = {0, 0};
  uint64_t ran_[2] = {0, 0};
  uint32_t random_ = 0x9E3779B9u;
  std::array<Point, kEvents> events_{};
  std::vector<char> send_host_;
  std::vector<char> recv_host_;
  std::vector<char> recv_device_;
  std::vector<char> scratch_;
  // Shared allocations, ours and the peers' mapped here, by data address.
  std::mutex shared_mu_;
  std::map<char*, shm::Segment> shared_;
};

}  // namespace

std::unique_ptr<Device> make_fake_device(int device) {
  return std::make_unique<FakeDevice>(device);
}

void fake_stream_write(uintptr_t stream, void* dst, std::string bytes) {
  CallerStreams::get().queue(
      stream, [dst, data = std::move(bytes)] { std::memcpy(dst, data.data(), data.size()); });
}

void fake_stream_sync(uintptr_t stream) {
  CallerStreams& streams = CallerStreams::get();
  streams.run_until(stream, streams.queued(stream));
}

}  // namespace rr
