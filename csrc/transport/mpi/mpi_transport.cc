#include "transport/mpi/mpi_transport.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "common/error.h"

namespace rr {
namespace {

// MPI counts are ints; pieces stay well below INT_MAX.
constexpr size_t kMaxPieceBytes = size_t{1} << 30;

// MPI requests in flight per peer and direction. More would not move bytes
// faster (a peer takes its messages in order) and would only lengthen every
// MPI_Testsome, which matters when a collective posts thousands of segments.
constexpr int kSendWindow = 8;
constexpr int kRecvWindow = 16;

// How long a wait keeps progressing after the awaited peer announced an
// abort, for data it sent before the notice.
constexpr double kAbortGraceSeconds = 0.05;

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
  // True every few idle rounds: when to look at the control channel.
  bool should_poll_control() const { return spins_ % 32 == 31; }

 private:
  unsigned spins_ = 0;
  Clock::time_point idle_since_{};
};

}  // namespace

// A send: one MPI message per piece of at most piece_bytes_.
struct MpiTransport::SendOp : Request {
  SendOp(int peer, const char* data, size_t bytes) : peer_(peer), base(data), total(bytes) {}
  bool done() const override { return bytes_done == total; }
  int peer() const override { return peer_; }

  int peer_;
  const char* base;
  size_t total;
  size_t posted = 0;  // bytes handed to MPI_Isend
  size_t bytes_done = 0;
};

// A receive of exactly `total` bytes into `base`. `matched` bytes have been
// assigned to MPI receives (or copied from a staging buffer); `received`
// bytes have landed.
struct MpiTransport::RecvOp : Request {
  RecvOp(int peer, char* data, size_t bytes) : peer_(peer), base(data), total(bytes) {}
  bool done() const override { return received == total; }
  int peer() const override { return peer_; }

  int peer_;
  char* base;
  size_t total;
  size_t matched = 0;
  size_t received = 0;
};

// Both directions of the stream with one peer.
struct MpiTransport::Link {
  // Sends not yet fully handed to MPI, in posting order.
  std::deque<std::shared_ptr<SendOp>> unposted;
  int sends_in_flight = 0;
  // Posted receives not yet fully matched, in posting order.
  std::deque<std::shared_ptr<RecvOp>> unmatched;
  int recvs_in_flight = 0;
  // A message larger than the head receive: taken whole, then copied out.
  std::vector<char> stage;
  size_t stage_len = 0;
  size_t stage_pos = 0;
  bool staging = false;
  bool stage_arrived = false;
};

// What one MPI request completes: a piece of a send, a part of a receive, or
// (neither set) the staging buffer of `peer`.
struct MpiTransport::InFlight {
  std::shared_ptr<SendOp> send;
  std::shared_ptr<RecvOp> recv;
  int peer;
  size_t bytes;
};

MpiTransport::MpiTransport(std::shared_ptr<MpiChannel> channel, size_t piece_bytes)
    : channel_(std::move(channel)),
      piece_bytes_(std::clamp<size_t>(piece_bytes, 1, kMaxPieceBytes)) {
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
  if (!slot) slot = std::make_unique<Link>();
  return *slot;
}

RequestPtr MpiTransport::isend(int peer, const void* data, size_t bytes) {
  auto op = std::make_shared<SendOp>(peer, static_cast<const char*>(data), bytes);
  if (bytes == 0) return op;  // as over TCP, an empty message is not sent at all
  check_peer(peer);
  auto lock = channel_->guard();
  Link& out = link(peer);
  out.unposted.push_back(op);
  post_sends(peer, out);
  return op;
}

// Hands the next pieces of `peer`'s queued sends to MPI, in order, up to the window.
void MpiTransport::post_sends(int peer, Link& out) {
  while (out.sends_in_flight < kSendWindow && !out.unposted.empty()) {
    const std::shared_ptr<SendOp>& op = out.unposted.front();
    const size_t piece = std::min(piece_bytes_, op->total - op->posted);
    MPI_Request request = MPI_REQUEST_NULL;
    // MPI_Isend takes a non-const buffer in MPI-2 headers; it only reads it.
    MpiChannel::check(MPI_Isend(const_cast<char*>(op->base + op->posted), static_cast<int>(piece),
                                MPI_BYTE, peer, MpiChannel::kDataTag, channel_->comm(), &request),
                      "MPI_Isend");
    op->posted += piece;
    ++out.sends_in_flight;
    track(request, InFlight{op, nullptr, peer, piece});
    if (op->posted == op->total) out.unposted.pop_front();
  }
}

RequestPtr MpiTransport::irecv(int peer, void* data, size_t bytes) {
  auto op = std::make_shared<RecvOp>(peer, static_cast<char*>(data), bytes);
  if (bytes == 0) return op;
  check_peer(peer);
  auto lock = channel_->guard();
  Link& in = link(peer);
  in.unmatched.push_back(op);
  // Take whatever already arrived, so small messages often complete here.
  match(peer, in);
  return op;
}

void MpiTransport::track(MPI_Request request, InFlight what) {
  requests_.push_back(request);
  in_flight_.push_back(std::move(what));
}

// Assigns arrived messages of `peer` to its posted receives, in order.
bool MpiTransport::match(int peer, Link& in) {
  bool moved = false;
  if (in.staging) {
    if (!in.stage_arrived) return false;
    moved = drain_stage(in);
    if (in.staging) return moved;  // the rest of the staged message awaits more receives
  }
  while (!in.unmatched.empty() && in.recvs_in_flight < kRecvWindow) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    MpiChannel::check(
        MPI_Improbe(peer, MpiChannel::kDataTag, channel_->comm(), &flag, &message, &status),
        "MPI_Improbe");
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    const size_t bytes = static_cast<size_t>(count);
    const std::shared_ptr<RecvOp>& head = in.unmatched.front();
    MPI_Request request = MPI_REQUEST_NULL;
    moved = true;
    if (bytes <= head->total - head->matched) {
      MpiChannel::check(MPI_Imrecv(head->base + head->matched, count, MPI_BYTE, &message, &request),
                        "MPI_Imrecv");
      head->matched += bytes;
      ++in.recvs_in_flight;
      track(request, InFlight{nullptr, head, peer, bytes});
      if (head->matched == head->total) in.unmatched.pop_front();
      continue;
    }
    if (in.stage.size() < bytes) in.stage.resize(bytes);
    in.stage_len = bytes;
    in.stage_pos = 0;
    in.staging = true;
    in.stage_arrived = false;
    MpiChannel::check(MPI_Imrecv(in.stage.data(), count, MPI_BYTE, &message, &request),
                      "MPI_Imrecv");
    ++in.recvs_in_flight;
    track(request, InFlight{nullptr, nullptr, peer, bytes});
    break;  // later messages belong after the staged bytes
  }
  return moved;
}

// Copies an arrived staged message into the posted receives, as far as they go.
bool MpiTransport::drain_stage(Link& in) {
  bool moved = false;
  while (in.stage_pos < in.stage_len && !in.unmatched.empty()) {
    RecvOp& head = *in.unmatched.front();
    const size_t n = std::min(in.stage_len - in.stage_pos, head.total - head.matched);
    std::memcpy(head.base + head.matched, in.stage.data() + in.stage_pos, n);
    head.matched += n;
    head.received += n;
    in.stage_pos += n;
    moved = true;
    if (head.matched == head.total) in.unmatched.pop_front();
  }
  if (in.stage_pos == in.stage_len) in.staging = false;
  return moved;
}

void MpiTransport::complete(const InFlight& what) {
  Link& l = link(what.peer);
  if (what.send) {
    --l.sends_in_flight;
    what.send->bytes_done += what.bytes;
    stats_.bytes_sent += what.bytes;
    post_sends(what.peer, l);
    return;
  }
  --l.recvs_in_flight;
  stats_.bytes_received += what.bytes;
  if (what.recv) {
    what.recv->received += what.bytes;
    return;
  }
  l.stage_arrived = true;
  drain_stage(l);
}

// One round: match arrivals on every stream, then test every request.
bool MpiTransport::progress() {
  auto lock = channel_->guard();
  bool moved = false;
  for (size_t peer = 0; peer < links_.size(); ++peer) {
    if (links_[peer]) moved |= match(static_cast<int>(peer), *links_[peer]);
  }
  if (requests_.empty()) return moved;
  const int n = static_cast<int>(requests_.size());
  completed_.resize(requests_.size());
  statuses_.resize(requests_.size());
  int count = 0;
  const int code = MPI_Testsome(n, requests_.data(), &count, completed_.data(), statuses_.data());
  if (code == MPI_ERR_IN_STATUS) {
    for (int i = 0; i < count; ++i) {
      const int err = statuses_[static_cast<size_t>(i)].MPI_ERROR;
      if (err == MPI_SUCCESS) continue;
      const InFlight& what = in_flight_[static_cast<size_t>(completed_[static_cast<size_t>(i)])];
      try {
        MpiChannel::check(err, what.send ? "MPI_Isend" : "MPI_Imrecv");
      } catch (const Error& e) {
        throw PeerError(std::string(e.what()) + " (with rank " + std::to_string(what.peer) + ")",
                        what.peer);
      }
    }
  }
  MpiChannel::check(code, "MPI_Testsome");
  if (count == MPI_UNDEFINED || count == 0) return moved;
  // Take the finished entries out first: completing a send piece posts the
  // next one, which appends to the vectors.
  finished_.clear();
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
  for (const InFlight& what : finished_) complete(what);
  finished_.clear();
  // A staging buffer that just arrived may let more messages be matched.
  for (size_t peer = 0; peer < links_.size(); ++peer) {
    if (links_[peer]) match(static_cast<int>(peer), *links_[peer]);
  }
  return true;
}

void MpiTransport::wait(Request& request, const Deadline& deadline) {
  try {
    Backoff backoff;
    bool peer_aborted = false;
    Deadline grace;
    // The deadline bounds time without progress, not the whole transfer (as
    // over TCP): every piece that lands restarts the window.
    Deadline window = deadline;
    uint64_t bytes_moved = stats_.bytes_sent + stats_.bytes_received;
    while (!request.done()) {
      const bool moved = progress();
      if (request.done()) break;
      if (stats_.bytes_sent + stats_.bytes_received != bytes_moved) {
        bytes_moved = stats_.bytes_sent + stats_.bytes_received;
        window = Deadline::after(deadline.seconds());
      }
      if (peer_aborted) {
        if (grace.expired()) fail_peer_aborted(request);
      } else if (backoff.should_poll_control()) {
        channel_->poll();
        if (channel_->announced(request.peer(), MpiChannel::Notice::kAbort)) {
          peer_aborted = true;
          grace = Deadline::after(kAbortGraceSeconds);
        }
      }
      if (window.expired()) last_call(request, window);
      backoff.pause(moved);
    }
  } catch (...) {
    failed_ = true;
    channel_->mark_failed();
    throw;
  }
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

void MpiTransport::fail_timeout(const Request& request, const Deadline& deadline) {
  size_t done = 0;
  size_t total = 0;
  std::string what;
  if (auto* send = dynamic_cast<const SendOp*>(&request)) {
    what = "sending to";
    done = send->bytes_done;
    total = send->total;
  } else {
    const auto& recv = static_cast<const RecvOp&>(request);
    what = "receiving from";
    done = recv.received;
    total = recv.total;
  }
  throw TimeoutError("no progress for " + format_seconds(deadline.seconds()) + " s " + what +
                         " rank " + std::to_string(request.peer()) + " over MPI (" +
                         std::to_string(done) + " of " + std::to_string(total) + " bytes done)",
                     request.peer());
}

void MpiTransport::fail_peer_aborted(const Request& request) {
  const bool sending = dynamic_cast<const SendOp*>(&request) != nullptr;
  throw PeerError("rank " + std::to_string(request.peer()) +
                      " gave up on the communicator (it failed or aborted) while rank " +
                      std::to_string(rank()) + " was " +
                      (sending ? "sending to it" : "waiting for data from it"),
                  request.peer());
}

bool MpiTransport::idle() const {
  if (!requests_.empty()) return false;
  for (const auto& l : links_) {
    if (l && (!l->unmatched.empty() || !l->unposted.empty() || l->staging)) return false;
  }
  return true;
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
    // Every receive in flight was matched to an arrived message (MPI_Imrecv),
    // so none can be cancelled; give them and the sends a moment to finish.
    const Deadline deadline = Deadline::after(0.2);
    for (size_t i = 0; i < requests_.size(); ++i) {
      int done = 0;
      while (MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             !deadline.expired()) {
        sched_yield();
      }
      if (done) continue;
      MPI_Request_free(&requests_[i]);
      if (!in_flight_[i].send && !in_flight_[i].recv) {
        // MPI may still write into this staging buffer: it must outlive us.
        (void)new std::vector<char>(std::move(link(in_flight_[i].peer).stage));
      }
    }
  } catch (...) {
    // abort() runs on error paths: it must not throw.
  }
  requests_.clear();
  in_flight_.clear();
  for (auto& l : links_) {
    if (l) {
      l->unmatched.clear();
      l->unposted.clear();
    }
  }
}

}  // namespace rr
