#include "engine/p2p.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "transport/waiter.h"

namespace rr {
namespace {

constexpr uint32_t kMagic = 0x52525032;  // "RRP2"

struct Header {
  uint32_t magic;
  uint32_t reserved;
  int64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 24, "the header is part of the wire format");

// How long the thread sleeps in one wait on the transport; wake() cuts it
// short when a new operation comes in, on close() and on interrupt().
constexpr std::chrono::milliseconds kSlice{50};

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

// A message of another size than the receive waiting for it.
std::exception_ptr size_mismatch(int peer, int rank, uint64_t sent, int64_t tag, uint64_t expected,
                                 const std::string& receive) {
  MismatchFacts f;
  f.reason = "message";
  f.ranks[0] = peer;
  f.ranks[1] = rank;
  f.calls[0] = "send of " + std::to_string(sent) + " bytes with tag " + std::to_string(tag);
  f.calls[1] = receive;
  return std::make_exception_ptr(MismatchError(
      rank_name(peer) + " sent " + std::to_string(sent) + " bytes with tag " + std::to_string(tag) +
          "; " + rank_name(rank) + " expected " + std::to_string(expected) + " (" + receive + ")",
      peer, std::move(f)));
}

}  // namespace

struct PointToPoint::Op {
  bool sending = false;
  char* data = nullptr;
  size_t bytes = 0;
  int peer = -1;  // for a receive, -1: any
  int64_t tag = 0;
  std::shared_ptr<Work> work;
  Header header{};
  std::vector<RequestPtr> requests;  // header (sends) and segments in flight
  Clock::time_point last_progress;
  size_t done_requests = 0;
};

struct PointToPoint::Incoming {
  Header header{};
  RequestPtr header_request;        // posted, or null
  bool active = false;              // header read, payload not yet all in
  std::shared_ptr<Op> target;       // the receive the payload goes to
  std::vector<char> keep;           // or kept here, for a later receive
  bool discard = false;             // or dropped (a receive of another size)
  std::vector<RequestPtr> payload;  // segments in flight
  size_t seen = 0;                  // of which this many were seen done
  Clock::time_point last_progress;
};

struct PointToPoint::Kept {
  int peer;
  int64_t tag;
  std::vector<char> data;
};

PointToPoint::PointToPoint(std::unique_ptr<Transport> transport, double timeout_seconds,
                           size_t segment_bytes)
    : rank_(transport->rank()),
      size_(transport->size()),
      timeout_(timeout_seconds),
      segment_(std::clamp<size_t>(segment_bytes, 1, size_t{1} << 30)),
      transport_(std::move(transport)) {
  incoming_.resize(static_cast<size_t>(size_));
  for (auto& in : incoming_) in = std::make_unique<Incoming>();
  thread_ = std::thread([this] { loop(); });
}

PointToPoint::~PointToPoint() { close(); }

std::shared_ptr<Work> PointToPoint::submit(const std::shared_ptr<Op>& op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) throw Error(rank_name(rank_) + ": the communicator is closed");
    if (interrupted_.load() && broken_.empty())
      throw Error(rank_name(rank_) + ": point-to-point was interrupted (Ctrl-C)");
    if (!broken_.empty())
      throw Error(rank_name(rank_) + ": point-to-point failed earlier: " + broken_);
    submitted_.push_back(op);
    submitted_count_.fetch_add(1);
  }
  cv_.notify_all();
  transport_->wake();
  return op->work;
}

std::shared_ptr<Work> PointToPoint::send(const void* data, size_t bytes, int dst, int64_t tag) {
  if (dst < 0 || dst >= size_ || dst == rank_) {
    throw InvalidArgument("send: dst must be another rank in [0, " + std::to_string(size_) +
                          "), got " + std::to_string(dst) + " on rank " + std::to_string(rank_));
  }
  auto op = std::make_shared<Op>();
  op->sending = true;
  op->data = static_cast<char*>(const_cast<void*>(data));
  op->bytes = bytes;
  op->peer = dst;
  op->tag = tag;
  op->work = std::make_shared<Work>("send(" + std::to_string(bytes) + " bytes, dst=" +
                                    std::to_string(dst) + ", tag=" + std::to_string(tag) + ")");
  return submit(op);
}

std::shared_ptr<Work> PointToPoint::recv(void* data, size_t bytes, int src, int64_t tag) {
  if (src >= size_ || src == rank_) {
    throw InvalidArgument("recv: src must be another rank in [0, " + std::to_string(size_) +
                          ") or any, got " + std::to_string(src) + " on rank " +
                          std::to_string(rank_));
  }
  auto op = std::make_shared<Op>();
  op->data = static_cast<char*>(data);
  op->bytes = bytes;
  op->peer = src < 0 ? -1 : src;
  op->tag = tag;
  op->work = std::make_shared<Work>("recv(" + std::to_string(bytes) +
                                    " bytes, src=" + (src < 0 ? "any" : std::to_string(src)) +
                                    ", tag=" + std::to_string(tag) + ")");
  return submit(op);
}

TransportStats PointToPoint::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool PointToPoint::pending() const {
  if (!sends_.empty() || !recvs_.empty()) return true;
  for (const auto& in : incoming_) {
    if (in->header_request || in->active) return true;
  }
  return false;
}

void PointToPoint::take_new_ops(std::deque<std::shared_ptr<Op>>& ops) {
  for (auto& op : ops) {
    op->last_progress = Clock::now();
    if (op->sending) {
      post_send(op);
    } else if (!match_kept(op)) {
      recvs_.push_back(op);
    }
  }
  ops.clear();
}

void PointToPoint::post_send(const std::shared_ptr<Op>& op) {
  op->header = Header{kMagic, 0, op->tag, op->bytes};
  op->requests.push_back(transport_->isend(op->peer, &op->header, sizeof op->header));
  for (size_t at = 0; at < op->bytes; at += segment_) {
    op->requests.push_back(
        transport_->isend(op->peer, op->data + at, std::min(segment_, op->bytes - at)));
  }
  sends_.push_back(op);
}

// A receive posted after its message arrived.
bool PointToPoint::match_kept(const std::shared_ptr<Op>& op) {
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    Kept& k = **it;
    if ((op->peer >= 0 && k.peer != op->peer) || k.tag != op->tag) continue;
    if (k.data.size() != op->bytes) {
      op->work->finish(
          size_mismatch(k.peer, rank_, k.data.size(), k.tag, op->bytes, op->work->description()));
    } else {
      if (op->bytes > 0) std::memcpy(op->data, k.data.data(), op->bytes);
      op->work->set_source(k.peer);
      op->work->finish();
    }
    kept_.erase(it);
    return true;
  }
  return false;
}

// Reads the next header from every peer some posted receive could take a
// message from.
void PointToPoint::post_headers() {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Incoming& in = *incoming_[static_cast<size_t>(peer)];
    if (in.header_request || in.active) continue;
    const bool wanted = std::any_of(recvs_.begin(), recvs_.end(), [&](const auto& op) {
      return op->peer == peer || op->peer < 0;
    });
    if (!wanted) continue;
    in.header_request = transport_->irecv(peer, &in.header, sizeof in.header);
    in.last_progress = Clock::now();
  }
}

void PointToPoint::on_header(int peer) {
  Incoming& in = *incoming_[static_cast<size_t>(peer)];
  in.header_request.reset();
  in.active = true;
  if (in.header.magic != kMagic) {
    throw Error(rank_name(rank_) + ": a point-to-point message from " + rank_name(peer) +
                " has a corrupt header");
  }
  const size_t bytes = in.header.bytes;
  // The first posted receive that takes this message, in posting order.
  auto it = std::find_if(recvs_.begin(), recvs_.end(), [&](const auto& op) {
    return (op->peer == peer || op->peer < 0) && op->tag == in.header.tag;
  });
  char* into = nullptr;
  if (it != recvs_.end()) {
    std::shared_ptr<Op> op = *it;
    recvs_.erase(it);
    if (op->bytes == bytes) {
      in.target = op;
      into = op->data;
    } else {
      op->work->finish(
          size_mismatch(peer, rank_, bytes, in.header.tag, op->bytes, op->work->description()));
      in.discard = true;
    }
  }
  if (into == nullptr) {
    in.keep.resize(bytes);
    into = in.keep.data();
  }
  for (size_t at = 0; at < bytes; at += segment_) {
    in.payload.push_back(transport_->irecv(peer, into + at, std::min(segment_, bytes - at)));
  }
  in.last_progress = Clock::now();
}

bool PointToPoint::advance() {
  transport_->progress();
  bool any = false;
  const Clock::time_point now = Clock::now();
  // Sends.
  for (auto it = sends_.begin(); it != sends_.end();) {
    Op& op = **it;
    while (op.done_requests < op.requests.size() && op.requests[op.done_requests]->done()) {
      ++op.done_requests;
      op.last_progress = now;
      ++events_;
    }
    if (op.done_requests == op.requests.size()) {
      op.work->finish();
      it = sends_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  // Receives, peer by peer: a header, then its payload.
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Incoming& in = *incoming_[static_cast<size_t>(peer)];
    if (in.header_request && in.header_request->done()) {
      on_header(peer);
      ++events_;
      any = true;
    }
    if (!in.active) continue;
    size_t done = 0;
    while (done < in.payload.size() && in.payload[done]->done()) ++done;
    if (done > in.seen) {
      in.last_progress = now;
      events_ += done - in.seen;
      in.seen = done;
    }
    if (done < in.payload.size()) continue;
    // The whole message is in.
    in.payload.clear();
    in.seen = 0;
    in.active = false;
    if (in.target) {
      in.target->work->set_source(peer);
      in.target->work->finish();
      in.target.reset();
    } else if (!in.discard) {
      kept_.push_back(std::unique_ptr<Kept>(new Kept{peer, in.header.tag, std::move(in.keep)}));
      // A receive may have been posted for it meanwhile.
      for (auto it = recvs_.begin(); it != recvs_.end();) {
        if (match_kept(*it)) {
          it = recvs_.erase(it);
          break;
        }
        ++it;
      }
    }
    in.keep = {};
    in.discard = false;
    any = true;
  }
  return any;
}

// An operation with no progress for the timeout fails, naming its peer; one
// side of a conversation giving up does not break the others.
void PointToPoint::check_deadlines() {
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  const Clock::time_point now = Clock::now();
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    Op& op = **it;
    if (now - op.last_progress < limit) {
      ++it;
      continue;
    }
    const int blame = op.peer;
    const std::string who = blame >= 0 ? rank_name(blame) : std::string("any rank");
    op.work->finish(std::make_exception_ptr(
        TimeoutError("no message for " + op.work->description() + " on " + rank_name(rank_) +
                         " came from " + who + " within " + format_seconds(timeout_) + " s",
                     blame)));
    it = recvs_.erase(it);
    ++events_;
  }
  for (const auto& op : sends_) {
    if (now - op->last_progress >= limit) {
      // Part of a message may be on its way: the link cannot be trusted.
      throw TimeoutError(rank_name(op->peer) + " did not take " + op->work->description() +
                             " from " + rank_name(rank_) + " within " + format_seconds(timeout_) +
                             " s (it never posted the matching receive?)",
                         op->peer);
    }
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Incoming& in = *incoming_[static_cast<size_t>(peer)];
    if (!in.payload.empty() && now - in.last_progress >= limit) {
      throw TimeoutError(rank_name(peer) + " stopped in the middle of a message to " +
                             rank_name(rank_) + " for " + format_seconds(timeout_) + " s",
                         peer);
    }
  }
}

RequestPtr PointToPoint::any_request() const {
  for (const auto& op : sends_) {
    if (op->done_requests < op->requests.size()) return op->requests[op->done_requests];
  }
  for (const auto& in : incoming_) {
    if (in->header_request) return in->header_request;
    for (const auto& r : in->payload) {
      if (!r->done()) return r;
    }
  }
  return nullptr;
}

void PointToPoint::fail_all(std::exception_ptr error) {
  for (auto& op : sends_) op->work->finish(error);
  for (auto& op : recvs_) op->work->finish(error);
  for (auto& in : incoming_) {
    if (in->target) in->target->work->finish(error);
    in->target.reset();
  }
  sends_.clear();
  recvs_.clear();
}

// The loop's wait for any event. Progress is the thread's own advance();
// every completed request, new operation, close() or interrupt() ends the
// wait (done), so nothing moves without the loop looking at the operations'
// clocks again, and the wait's window never needs renewing (moved() stays 0).
// Blame is each operation's own (check_deadlines); a failure the transport
// sees (a dead peer) is thrown by its progress or wait, naming that peer.
class PointToPoint::Events final : public Waitable {
 public:
  explicit Events(PointToPoint& p2p)
      : p2p_(p2p), events_(p2p.events_), submitted_(p2p.taken_), stop_(p2p.stop_.load()) {}
  bool done() const override {
    return again_ || p2p_.events_ != events_ || p2p_.submitted_count_.load() != submitted_ ||
           p2p_.stop_.load() != stop_;
  }
  void progress() override { p2p_.advance(); }
  uint64_t moved() const override { return 0; }
  void pause() override {}
  void block(uint32_t, std::chrono::microseconds bound) override {
    if (RequestPtr request = p2p_.any_request()) {
      p2p_.transport_->wait_for(*request, bound);
      return;
    }
    std::unique_lock<std::mutex> lock(p2p_.mu_);
    p2p_.cv_.wait_for(lock, bound, [this] { return done(); });
  }
  // The first operation's clock ran out: it fails, or the whole thread does.
  void timed_out(const Deadline&) override {
    p2p_.check_deadlines();
    again_ = true;
  }

 private:
  PointToPoint& p2p_;
  const uint64_t events_;
  const uint64_t submitted_;
  const bool stop_;  // close() or interrupt() came before this wait
  bool again_ = false;
};

// Seconds until the first pending operation's clock runs out (at least 0).
double PointToPoint::seconds_to_first_deadline() const {
  Clock::time_point first = Clock::time_point::max();
  for (const auto& op : recvs_) first = std::min(first, op->last_progress);
  for (const auto& op : sends_) first = std::min(first, op->last_progress);
  for (const auto& in : incoming_) {
    if (!in->payload.empty()) first = std::min(first, in->last_progress);
  }
  if (first == Clock::time_point::max()) return timeout_;
  const double waited = std::chrono::duration<double>(Clock::now() - first).count();
  return std::max(0.0, timeout_ - waited);
}

void PointToPoint::loop() {
  transport_->set_eager(false);
  std::deque<std::shared_ptr<Op>> fresh;
  // On close, sends in flight get this long to leave; receives end at once.
  const auto flush = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(timeout_, 10.0)));
  Clock::time_point closing_since{};
  WaitPolicy policy;  // no spinning of its own: the transport's wait_for spins
  policy.max_sleep = kSlice;
  try {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!pending()) {
          cv_.wait(lock, [this] { return closing_ || !submitted_.empty() || interrupted_.load(); });
        }
        interrupt_.check();
        fresh.swap(submitted_);
        taken_ += fresh.size();
        stats_ = transport_->stats();
        if (closing_) {
          if (closing_since == Clock::time_point{}) closing_since = Clock::now();
          if (fresh.empty() && (sends_.empty() || Clock::now() - closing_since > flush)) break;
        }
      }
      take_new_ops(fresh);
      post_headers();
      const uint64_t before = events_;
      advance();
      check_deadlines();
      // What completed may let more be posted (the next header from that peer).
      if (events_ != before || !pending()) continue;
      Events events(*this);
      if (events.done()) continue;
      // While closing, the flush bounds the wait too.
      double seconds = seconds_to_first_deadline();
      if (closing_since != Clock::time_point{}) {
        seconds = std::min(
            seconds, std::chrono::duration<double>(closing_since + flush - Clock::now()).count());
      }
      wait_until_done(events, Deadline::after(std::max(0.0, seconds), &interrupt_), policy);
    }
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    std::string what = "point-to-point failed";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = what;
      for (auto& op : submitted_) op->work->finish(error);
      submitted_.clear();
    }
    for (auto& op : fresh) op->work->finish(error);
    fail_all(error);
    transport_->abort();
  }
}

void PointToPoint::interrupt() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_ || interrupted_.load()) return;
  interrupted_.store(true);
  stop_.store(true);
  cv_.notify_all();
  // Under the lock: close() cannot tear the transport down meanwhile.
  transport_->wake();
}

void PointToPoint::close() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ && !thread_.joinable()) return;
    closing_ = true;
    stop_.store(true);
  }
  cv_.notify_all();
  transport_->wake();
  if (thread_.joinable()) thread_.join();
  // Receives nobody sent to: they end here.
  fail_all(std::make_exception_ptr(
      Error(rank_name(rank_) + ": the communicator was closed before the message arrived")));
  transport_->close();
}

}  // namespace rr
