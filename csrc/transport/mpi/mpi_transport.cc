#include "transport/mpi/mpi_transport.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "common/error.h"
#include "transport/waiter.h"

namespace rr {
namespace {

// MPI counts are ints; the engine keeps segments at or below 1 GiB.
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

// Sends in flight per peer (see the header).
constexpr int kSendWindow = 8;

// How long a wait keeps progressing after the awaited peer announced an
// abort, for data it sent before the notice.
constexpr double kAbortGraceSeconds = 0.05;
// After the liveness watch saw the peer we wait on end, or another rank die.
constexpr double kGoneGraceSeconds = 0.2;
constexpr double kDeadElsewhereSeconds = 3.0;

// Ranks waiting on each other in a chain with one timeout expire almost
// together, and each would blame the neighbour it waited on. So a wait that
// passes its deadline first announces that it is timing out, then listens
// this long for the awaited peer: if that peer is timing out too, it waits
// for the peer's failure (its report names the rank further up the chain);
// if the peer failed already, it fails with it. Only then does it time out.
constexpr double kLastCallSeconds = 0.1;
constexpr double kPeerTimingOutSeconds = 1.0;

// Waiting without progress: spin first (a neighbour's message is usually
// microseconds away), then yield the core (ranks may share cores), then sleep
// in short slices so an idle wait on a slow peer costs no CPU.
class Backoff {
 public:
  void pause(bool moved) {
    if (moved) {
      spins_ = 0;
      return;
    }
    if (spins_++ == 0) idle_since_ = Clock::now();
    if (spins_ < 64) return;
    if (Clock::now() - idle_since_ < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  unsigned spins_ = 0;
  Clock::time_point idle_since_{};
};

}  // namespace

// One message: a send, or a receive into the caller's memory or into a view
// (`slot`, owned until released).
struct MpiTransport::Op : Request {
  Op(int peer, char* data, size_t bytes, bool sending)
      : peer_(peer), data(data), bytes(bytes), sending_(sending) {}
  bool done() const override { return done_; }
  int peer() const override { return peer_; }
  const char* view() const override { return slot && done_ ? slot->data() : nullptr; }
  bool sending() const override { return sending_; }
  std::string what() const override { return describe_message(sending_, bytes, peer_); }

  int peer_;
  char* data;
  size_t bytes;
  bool sending_;
  bool done_ = false;
  ViewPool::Slot slot;
};

struct MpiTransport::Link {
  int peer = -1;
  // Sends not yet handed to MPI, in posting order.
  std::deque<std::shared_ptr<Op>> unposted;
  int sends_in_flight = 0;
  // Buffers of released views, reused by the next irecv_view.
  ViewPool views;
};

MpiTransport::MpiTransport(std::shared_ptr<MpiChannel> channel) : channel_(std::move(channel)) {
  links_.resize(static_cast<size_t>(channel_->size()));
}

MpiTransport::~MpiTransport() { abort(); }

void MpiTransport::check_peer(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw Error("mpi transport: rank " + std::to_string(rank()) + " cannot talk to rank " +
                std::to_string(peer) + " in a world of " + std::to_string(size()));
  }
}

MpiTransport::Link& MpiTransport::link(int peer) {
  auto& slot = links_[static_cast<size_t>(peer)];
  if (!slot) {
    slot = std::make_unique<Link>();
    slot->peer = peer;
  }
  return *slot;
}

namespace {

void check_size(size_t bytes) {
  if (bytes > kMaxMessageBytes) {
    throw Error("mpi transport: a message of " + std::to_string(bytes) +
                " bytes is larger than the 1 GiB a message may carry");
  }
}

}  // namespace

RequestPtr MpiTransport::isend(int peer, const void* data, size_t bytes) {
  auto op = std::make_shared<Op>(peer, static_cast<char*>(const_cast<void*>(data)), bytes, true);
  if (bytes == 0) {
    op->done_ = true;  // an empty message is not sent at all
    return op;
  }
  check_peer(peer);
  check_size(bytes);
  auto lock = channel_->guard();
  Link& out = link(peer);
  out.unposted.push_back(op);
  post_sends(out);
  return op;
}

// Hands the next queued sends of a peer to MPI, in order, up to the window.
void MpiTransport::post_sends(Link& out) {
  while (out.sends_in_flight < kSendWindow && !out.unposted.empty()) {
    std::shared_ptr<Op> op = std::move(out.unposted.front());
    out.unposted.pop_front();
    MPI_Request request = MPI_REQUEST_NULL;
    MpiChannel::check(MPI_Isend(op->data, static_cast<int>(op->bytes), MPI_BYTE, out.peer,
                                MpiChannel::kDataTag, channel_->comm(), &request),
                      "MPI_Isend");
    ++out.sends_in_flight;
    requests_.push_back(request);
    in_flight_.push_back(std::move(op));
  }
}

RequestPtr MpiTransport::irecv(int peer, void* data, size_t bytes) {
  return post_recv(std::make_shared<Op>(peer, static_cast<char*>(data), bytes, false));
}

RequestPtr MpiTransport::irecv_view(int peer, size_t bytes) {
  check_peer(peer);
  ViewPool::Slot slot = link(peer).views.take(bytes);
  auto op = std::make_shared<Op>(peer, slot->data(), bytes, false);
  op->slot = std::move(slot);
  return post_recv(std::move(op));
}

void MpiTransport::release(Request& view) {
  auto& op = static_cast<Op&>(view);
  if (!op.slot) return;
  if (!op.done_) throw Error("mpi transport: a view was released before its message arrived");
  link(op.peer_).views.give_back(std::move(op.slot));
}

RequestPtr MpiTransport::post_recv(std::shared_ptr<Op> op) {
  if (op->bytes == 0) {
    op->done_ = true;
    return op;
  }
  check_peer(op->peer_);
  check_size(op->bytes);
  auto lock = channel_->guard();
  MPI_Request request = MPI_REQUEST_NULL;
  MpiChannel::check(MPI_Irecv(op->data, static_cast<int>(op->bytes), MPI_BYTE, op->peer_,
                              MpiChannel::kDataTag, channel_->comm(), &request),
                    "MPI_Irecv");
  requests_.push_back(request);
  in_flight_.push_back(op);
  return op;
}

// A message of another size than the receive expected means the two ranks cut
// a step differently: a bug or mismatched settings, never to be read as data.
void MpiTransport::complete(Op& op, const MPI_Status& status) {
  if (op.sending_) {
    --link(op.peer_).sends_in_flight;
    stats_.bytes_sent += op.bytes;
    op.done_ = true;
    post_sends(link(op.peer_));
    return;
  }
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (static_cast<size_t>(count) != op.bytes) {
    throw Error("mpi transport: rank " + std::to_string(op.peer_) + " sent a message of " +
                std::to_string(count) + " bytes where rank " + std::to_string(rank()) +
                " expected " + std::to_string(op.bytes) + " (the ranks cut a step differently)");
  }
  stats_.bytes_received += op.bytes;
  op.done_ = true;
}

// One round: test every request in flight.
bool MpiTransport::progress() {
  auto lock = channel_->guard();
  if (requests_.empty()) return false;
  const int n = static_cast<int>(requests_.size());
  completed_.resize(requests_.size());
  statuses_.resize(requests_.size());
  int count = 0;
  const int code = MPI_Testsome(n, requests_.data(), &count, completed_.data(), statuses_.data());
  if (code == MPI_ERR_IN_STATUS) {
    for (int i = 0; i < count; ++i) {
      const MPI_Status& status = statuses_[static_cast<size_t>(i)];
      if (status.MPI_ERROR == MPI_SUCCESS) continue;
      const Op& op = *in_flight_[static_cast<size_t>(completed_[static_cast<size_t>(i)])];
      const char* what = op.sending_ ? "MPI_Isend" : "MPI_Irecv";
      if (status.MPI_ERROR == MPI_ERR_TRUNCATE) {
        throw Error("mpi transport: rank " + std::to_string(op.peer_) +
                    " sent a message larger than the " + std::to_string(op.bytes) + " bytes rank " +
                    std::to_string(rank()) + " expected (the ranks cut a step differently)");
      }
      try {
        MpiChannel::check(status.MPI_ERROR, what);
      } catch (const Error& e) {
        throw PeerError(std::string(e.what()) + " (with rank " + std::to_string(op.peer_) + ")",
                        op.peer_);
      }
    }
  }
  MpiChannel::check(code, "MPI_Testsome");
  if (count == MPI_UNDEFINED || count == 0) return false;
  // Take the finished entries out first: completing a send posts the next
  // one, which appends to the vectors.
  finished_.clear();
  std::vector<MPI_Status> done_status(statuses_.begin(), statuses_.begin() + count);
  for (int i = 0; i < count; ++i) {
    finished_.push_back(std::move(in_flight_[static_cast<size_t>(completed_[i])]));
  }
  // Completed requests are now MPI_REQUEST_NULL: drop them, keeping order.
  size_t kept = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    if (kept != i) {
      requests_[kept] = requests_[i];
      in_flight_[kept] = std::move(in_flight_[i]);
    }
    ++kept;
  }
  requests_.resize(kept);
  in_flight_.resize(kept);
  for (size_t i = 0; i < finished_.size(); ++i) complete(*finished_[i], done_status[i]);
  finished_.clear();
  return true;
}

// The waiter's view of one wait over MPI. Progress is any message that
// lands, on any link (MPI completes requests in no order we choose, and a
// death elsewhere stalls the collective only a step later: check_liveness).
// The peer is looked at every few idle rounds through the control channel
// (an abort it announced, then a short grace for its last data) and the
// liveness mesh. There is nothing to sleep on: pause() backs off from
// spinning to yielding to short sleeps. At the deadline, a last call: we say
// we are timing out and give a peer that says the same a moment more. A
// sliced wait (wait_for) lasts too short for the grace and the liveness
// rules, which count time since something moved: there an announced abort
// fails the wait at once, and the caller's deadline does the rest.
struct MpiTransport::Waiting final : Waitable {
  Waiting(MpiTransport& t, Request& request, bool sliced)
      : t(t), request(request), sliced(sliced) {}
  bool done() const override { return request.done(); }
  void progress() override {
    moved_now = t.progress();
    if (moved_now) moved_at = Clock::now();
  }
  uint64_t moved() const override { return t.stats_.bytes_sent + t.stats_.bytes_received; }
  void check_peer() override {
    if (peer_aborted) {
      if (grace.expired()) t.fail_peer_aborted(request);
      return;
    }
    t.channel_->poll();
    if (t.channel_->announced(request.peer(), MpiChannel::Notice::kAbort)) {
      if (sliced) t.fail_peer_aborted(request);
      peer_aborted = true;
      grace = Deadline::after(kAbortGraceSeconds);
    }
    if (!sliced) t.check_liveness(request, moved_at);
  }
  void pause() override { backoff.pause(moved_now); }
  void block(uint32_t, std::chrono::microseconds) override { backoff.pause(moved_now); }
  void timed_out(const Deadline& window) override { t.last_call(request, window); }
  bool woken() const override { return t.wakes_.load() != wakes; }
  WaitContext context() const override { return {t.rank(), request.what(), t.name()}; }

  MpiTransport& t;
  Request& request;
  const bool sliced;
  const uint64_t wakes = t.wakes_.load();
  Backoff backoff;
  bool moved_now = false;
  Clock::time_point moved_at = Clock::now();
  bool peer_aborted = false;
  Deadline grace;
};

namespace {

WaitPolicy mpi_policy() {
  WaitPolicy policy;
  policy.spin = std::chrono::hours(24 * 365);  // pause() backs off by itself
  policy.rounds_per_look = 1;
  policy.looks_per_check = 32;
  return policy;
}

}  // namespace

void MpiTransport::wait(Request& request, const Deadline& deadline) {
  try {
    Waiting waiting(*this, request, false);
    wait_until_done(waiting, deadline, mpi_policy());
  } catch (...) {
    failed_ = true;
    channel_->mark_failed();
    throw;
  }
}

void MpiTransport::check_liveness(const Request& request, Clock::time_point moved_at) {
  const Liveness* live = channel_->liveness();
  if (live == nullptr) return;
  // Data already on its way from a rank that just ended may still land: the
  // peer we wait on gets a moment, and a death elsewhere (which stalls the
  // collective a step later) fails us only once nothing moves any more.
  const double still = std::chrono::duration<double>(Clock::now() - moved_at).count();
  const Liveness::State peer_state = live->state(request.peer());
  int gone = -1;
  Liveness::State state = Liveness::State::kAlive;
  if (peer_state != Liveness::State::kAlive && still > kGoneGraceSeconds) {
    gone = request.peer();
    state = peer_state;
  } else if (still > kDeadElsewhereSeconds) {
    gone = live->first_died();
    state = Liveness::State::kDied;
  }
  if (gone < 0) return;
  throw PeerError(Liveness::describe(gone, state), gone);
}

void MpiTransport::last_call(Request& request, const Deadline& deadline) {
  using Notice = MpiChannel::Notice;
  channel_->announce(Notice::kTimingOut);
  Deadline until = Deadline::after(kLastCallSeconds);
  bool extended = false;
  while (!until.expired()) {
    progress();
    if (request.done()) return;
    channel_->poll();
    if (channel_->announced(request.peer(), Notice::kAbort)) fail_peer_aborted(request);
    if (!extended && channel_->announced(request.peer(), Notice::kTimingOut)) {
      until = Deadline::after(kPeerTimingOutSeconds);
      extended = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  fail_timeout(request, deadline);
}

bool MpiTransport::wait_for(Request& request, std::chrono::microseconds slice) {
  try {
    if (request.done()) return true;
    Waiting waiting(*this, request, true);
    return wait_slice(waiting, slice, mpi_policy());
  } catch (...) {
    failed_ = true;
    channel_->mark_failed();
    throw;
  }
}

void MpiTransport::fail_timeout(const Request& request, const Deadline& deadline) {
  const auto& op = static_cast<const Op&>(request);
  throw_no_progress(deadline, op.what(), name(), op.peer_);
}

void MpiTransport::fail_peer_aborted(const Request& request) {
  throw PeerError("rank " + std::to_string(request.peer()) +
                      " gave up on the communicator (it failed or aborted)",
                  request.peer());
}

bool MpiTransport::idle() const {
  if (!requests_.empty()) return false;
  for (const auto& l : links_) {
    if (l && !l->unposted.empty()) return false;
  }
  return true;
}

void MpiTransport::close() noexcept {
  abort();
  channel_->leave();
}

void MpiTransport::abort() noexcept {
  if (aborted_) return;
  aborted_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  try {
    auto lock = channel_->guard();
    // A normal close has nothing in flight and nothing to tell: the peers
    // finished the same collectives. After a failure, tell them, so that a
    // peer waiting on us fails now rather than at its deadline.
    if (!failed_ && !channel_->failed() && idle()) return;
    channel_->mark_failed();
    channel_->announce(MpiChannel::Notice::kAbort);
    // Receives still waiting for their message are cancelled; sends and the
    // rest get a moment to finish.
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (!in_flight_[i]->sending_) MPI_Cancel(&requests_[i]);
    }
    const Deadline deadline = Deadline::after(0.2);
    for (size_t i = 0; i < requests_.size(); ++i) {
      int done = 0;
      while (MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             !deadline.expired()) {
        sched_yield();
      }
      if (done) continue;
      MPI_Request_free(&requests_[i]);
      // MPI may still write into a view's buffer: it must outlive us.
      if (in_flight_[i]->slot) (void)in_flight_[i]->slot.release();
    }
  } catch (...) {
    // abort() runs on error paths: it must not throw.
  }
  requests_.clear();
  in_flight_.clear();
  for (auto& l : links_) {
    if (l) l->unposted.clear();
  }
}

}  // namespace rr
