#include "executor/host_executor.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "common/error.h"
#include "executor/segments.h"

namespace rr {
namespace {

// Receives posted ahead of the segment being handled. Views are the
// transport's memory, of which it lends only a few; receives straight into
// place cost nothing to keep posted.
constexpr size_t kViewsAhead = Transport::kMaxViews;
constexpr size_t kDirectAhead = 8;

}  // namespace

HostExecutor::HostExecutor(const ExecutorSetup& setup, std::vector<char>& storage)
    : setup_(setup),
      transport_(setup.transport),
      reduce_(cpu_reduce_fn(setup.dtype, setup.op)),
      stream_sum_(setup.op == ReduceOp::kSum || setup.op == ReduceOp::kAvg
                      ? cpu_stream_sum_fn(setup.dtype)
                      : nullptr),
      elem_(dtype_size(setup.dtype)),
      segment_(segment_size(setup.segment_bytes, elem_)) {
  if (storage.size() < setup.scratch_bytes) storage.resize(setup.scratch_bytes);
  scratch_ = storage.data();
}

void HostExecutor::step(const StepPlan& plan) {
  if (plan.forward && plan.reduce_with != nullptr) {
    throw Error("host executor: a step cannot both reduce and forward");
  }
  sends_.clear();
  const size_t send_segments = segments_in(plan.send_bytes, segment_);
  for (size_t j = 0; j < send_segments; ++j) {
    sends_.push_back(transport_.isend(plan.send_to, plan.send + j * segment_,
                                      segment_length(plan.send_bytes, segment_, j)));
  }

  // A segment to reduce is read where the transport received it; one to keep
  // is received straight into its place.
  const bool reducing = plan.reduce_with != nullptr;
  // A large output, out of place: streamed, not read into the cache first.
  const bool stream = reducing && stream_sum_ != nullptr && setup_.stream_store_bytes > 0 &&
                      plan.recv_bytes >= setup_.stream_store_bytes &&
                      (plan.recv + plan.recv_bytes <= plan.reduce_with ||
                       plan.reduce_with + plan.recv_bytes <= plan.recv);
  const ReduceFn sum = stream ? stream_sum_ : reduce_;
  const size_t recv_segments = segments_in(plan.recv_bytes, segment_);
  const size_t ahead = reducing ? kViewsAhead : kDirectAhead;
  std::deque<RequestPtr> posted;
  size_t next = 0;
  auto post_ahead = [&] {
    for (; next < recv_segments && posted.size() < ahead; ++next) {
      const size_t len = segment_length(plan.recv_bytes, segment_, next);
      posted.push_back(reducing
                           ? transport_.irecv_view(plan.recv_from, len)
                           : transport_.irecv(plan.recv_from, plan.recv + next * segment_, len));
    }
  };
  post_ahead();
  for (size_t j = 0; j < recv_segments; ++j) {
    RequestPtr received = std::move(posted.front());
    posted.pop_front();
    transport_.wait(*received, setup_.deadline());
    post_ahead();
    const size_t offset = j * segment_;
    const size_t len = segment_length(plan.recv_bytes, segment_, j);
    if (reducing) {
      char* out = plan.recv + offset;
      const size_t n = len / elem_;
      if (plan.divide_by <= 1) {
        sum(out, plan.reduce_with + offset, received->view(), n);
      } else if (!sum_divide(setup_.dtype, out, plan.reduce_with + offset, received->view(), n,
                             plan.divide_by)) {
        reduce_(out, plan.reduce_with + offset, received->view(), n);
        divide_by(setup_.dtype, out, n, plan.divide_by);
      }
      transport_.release(*received);
    }
    if (plan.forward) sends_.push_back(transport_.isend(plan.send_to, plan.recv + offset, len));
  }
  for (RequestPtr& send : sends_) transport_.wait(*send, setup_.deadline());
  sends_.clear();
}

// Every segment of every plan is posted before any is waited for, so all
// peers' messages travel at once: one dependent step instead of several.
void HostExecutor::post(const std::vector<StepPlan>& plans) {
  sends_.clear();
  recvs_.clear();
  for (const StepPlan& plan : plans) {
    if (plan.forward || plan.reduce_with != nullptr) {
      throw Error("host executor: exchanged steps neither reduce nor forward");
    }
    for (size_t j = 0; j < segments_in(plan.send_bytes, segment_); ++j) {
      sends_.push_back(transport_.isend(plan.send_to, plan.send + j * segment_,
                                        segment_length(plan.send_bytes, segment_, j)));
    }
    for (size_t j = 0; j < segments_in(plan.recv_bytes, segment_); ++j) {
      recvs_.push_back(transport_.irecv(plan.recv_from, plan.recv + j * segment_,
                                        segment_length(plan.recv_bytes, segment_, j)));
    }
  }
}

void HostExecutor::wait_posted() {
  for (RequestPtr& recv : recvs_) transport_.wait(*recv, setup_.deadline());
  for (RequestPtr& send : sends_) transport_.wait(*send, setup_.deadline());
  sends_.clear();
  recvs_.clear();
}

void HostExecutor::exchange(const std::vector<StepPlan>& plans) {
  post(plans);
  wait_posted();
}

void HostExecutor::exchange_while(const std::vector<StepPlan>& plans,
                                  const std::function<void()>& meanwhile) {
  post(plans);
  meanwhile();
  wait_posted();
}

void HostExecutor::poke() { transport_.progress(); }

namespace {

// The CPU's codec loops and float32 arithmetic.
class HostCodecOps final : public CodecOps {
 public:
  void encode(codec::CodecKind kind, const float* x, float* residual, bool residual_out_only,
              size_t n, uint64_t key, uint8_t* payload, uint64_t first) override {
    // The loops add the residual in: -0.0 leaves every value's bits as they
    // are (signed zeros too), so what they write is x's residual alone.
    if (residual != nullptr && residual_out_only) std::fill(residual, residual + n, -0.0f);
    codec::encode(kind, x, residual, n, key, payload, first);
  }
  void decode(codec::CodecKind kind, const uint8_t* payload, size_t n, float* out) override {
    codec::decode(kind, payload, n, out);
  }
  void decode_add(codec::CodecKind kind, const uint8_t* const* payloads, size_t count, size_t n,
                  float* acc) override {
    codec::decode_add(kind, payloads, count, n, acc);
  }
  void convert(DataType to, void* dst, DataType from, const void* src, size_t n) override {
    codec::convert(to, dst, from, src, n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void divide(float* data, size_t n, int divisor) override {
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) data[i] /= d;
  }
  void zero(float* data, size_t n) override { std::fill(data, data + n, 0.0f); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void settle() override {}
};

}  // namespace

CodecOps* HostExecutor::codec_ops() {
  static HostCodecOps ops;  // stateless
  return &ops;
}

bool HostExecutor::direct_reduce(int rank, int size, const void* send_data, void* recv,
                                 size_t count) {
  const size_t bytes = count * elem_;
  // In place, the sends would read what the reduction writes; a vector longer
  // than a message would need several views per peer.
  if (send_data == recv || size < 2 || bytes == 0 || bytes > segment_) return false;
  const int n = size;
  const char* send = static_cast<const char*>(send_data);
  char* out = static_cast<char*>(recv);
  sends_.clear();
  recvs_.assign(static_cast<size_t>(n), nullptr);  // by rank
  for (int i = 1; i < n; ++i) sends_.push_back(transport_.isend((rank + i) % n, send, bytes));
  for (int i = 1; i < n; ++i) {
    const int from = (rank + n - i) % n;
    recvs_[static_cast<size_t>(from)] = transport_.irecv_view(from, bytes);
  }
  for (int i = 1; i < n; ++i) {
    transport_.wait(*recvs_[static_cast<size_t>((rank + n - i) % n)], setup_.deadline());
  }
  auto vector_of = [&](int r) { return r == rank ? send : recvs_[static_cast<size_t>(r)]->view(); };
  reduce_(out, vector_of(0), vector_of(1), count);
  for (int r = 2; r < n; ++r) reduce_(out, out, vector_of(r), count);
  for (RequestPtr& view : recvs_) {
    if (view) transport_.release(*view);
  }
  for (RequestPtr& s : sends_) transport_.wait(*s, setup_.deadline());
  sends_.clear();
  recvs_.clear();
  return true;
}

void HostExecutor::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void HostExecutor::reduce(void* out, const void* a, const void* b, size_t n) {
  reduce_(out, a, b, n);
}

void HostExecutor::divide(void* data, size_t n, int divisor) {
  divide_by(setup_.dtype, data, n, divisor);
}

}  // namespace rr
