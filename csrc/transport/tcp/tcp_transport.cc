#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "transport/tcp/hello.h"
#include "transport/tcp/tcp_internal.h"
#include "transport/waiter.h"

namespace rr {

TcpTransport::TcpTransport(int rank, int size, std::chrono::microseconds spin)
    : rank_(rank), size_(size), wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), spin_(spin) {}

void TcpTransport::wake() {
  wakes_.fetch_add(1);
  if (!wake_fd_.valid()) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof one);
  (void)ignored;
}
TcpTransport::~TcpTransport() = default;

RequestPtr TcpTransport::post(std::shared_ptr<Op> op) {
  if (op->total > 0) {
    Link& link = link_to(op->peer_, op->sending_);
    if (!link.awaiting()) {
      for (const Stream& stream : link.streams) {
        if (!stream.fd.valid()) {
          throw PeerError("connection to rank " + std::to_string(op->peer_) + " is closed",
                          op->peer_);
        }
      }
    }
    distribute(link, op);
    // Start moving bytes now: small messages often complete right here.
    try {
      progress(link);
    } catch (const PeerError& e) {
      throw_in_context(e, {rank_, op->what(), name()});  // as it starts
    }
  }
  return op;
}

void TcpTransport::distribute(Link& link, const std::shared_ptr<Op>& op) {
  const size_t n = link.streams.size();
  const size_t first = static_cast<size_t>(link.messages++ % n);
  if (n == 1 || op->total < kStripeMinBytes) {
    link.streams[first].queue.push_back({op, op->data, op->total});
    return;
  }
  const size_t per = (op->total + n - 1) / n;
  const size_t piece = (per + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
  size_t offset = 0;
  for (size_t i = 0; i < n && offset < op->total; ++i) {
    const size_t bytes = std::min(piece, op->total - offset);
    link.streams[(first + i) % n].queue.push_back({op, op->data + offset, bytes});
    offset += bytes;
  }
}

RequestPtr TcpTransport::isend(int peer, const void* data, size_t bytes) {
  return post(std::make_shared<Op>(peer, static_cast<char*>(const_cast<void*>(data)), bytes, true));
}

RequestPtr TcpTransport::irecv(int peer, void* data, size_t bytes) {
  return post(std::make_shared<Op>(peer, static_cast<char*>(data), bytes, false));
}

// A socket has no memory of its own to lend: a view is a buffer of ours that
// the message is read into, kept for the next view once released.
RequestPtr TcpTransport::irecv_view(int peer, size_t bytes) {
  ViewPool::Slot slot = link_to(peer, false).views.take(bytes);
  auto op = std::make_shared<Op>(peer, slot->data(), bytes, false);
  op->slot = std::move(slot);
  return post(std::move(op));
}

void TcpTransport::release(Request& view) {
  auto& op = static_cast<Op&>(view);
  if (!op.slot) return;
  if (!op.done()) {
    throw Error("tcp transport: a view was released before its message arrived");
  }
  link_to(op.peer_, false).views.give_back(std::move(op.slot));
}

namespace {

// A stream to or from `peer` failed with `err`.
[[noreturn]] void fail_link(int peer, int err, int keepalive_seconds) {
  if (unreachable_errno(err) && keepalive_seconds > 0) {
    throw PeerError("rank " + std::to_string(peer) +
                        "'s machine stopped answering: no reply to TCP keepalive probes for " +
                        std::to_string(keepalive_seconds) +
                        " s (a network partition, or its host froze or lost power; "
                        "RINGREDUCE_TCP_KEEPALIVE sets how long)",
                    peer, kUnreachable);
  }
  throw PeerError(errno_message("connection to rank " + std::to_string(peer) + " failed", err),
                  peer);
}

}  // namespace

void TcpTransport::progress(Link& link) {
  for (Stream& stream : link.streams) {
    if (!stream.fd.valid()) continue;  // not connected yet (or aborted)
    while (!stream.queue.empty()) {
      Piece& p = stream.queue.front();
      ssize_t k = link.sending
                      ? ::send(stream.fd.get(), p.cursor, p.left, MSG_NOSIGNAL | MSG_DONTWAIT)
                      : ::recv(stream.fd.get(), p.cursor, p.left, MSG_DONTWAIT);
      if (k > 0) {
        p.cursor += k;
        p.left -= static_cast<size_t>(k);
        p.op->left -= static_cast<size_t>(k);
        link.moved += static_cast<uint64_t>(k);
        stream.moved += static_cast<uint64_t>(k);
        (link.sending ? stats_.bytes_sent : stats_.bytes_received) += static_cast<uint64_t>(k);
        if (p.left == 0) stream.queue.pop_front();
        continue;
      }
      if (errno == EINTR && k < 0) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && k < 0) break;
      stream.failed = true;  // whatever the peer says next, this stream is done
      note(link, k == 0 ? 0 : errno);
      if (k == 0 && !link.sending) {
        throw PeerError("rank " + std::to_string(link.peer) +
                            " closed its connection (it exited, crashed or aborted) " +
                            std::to_string(p.op->left) + " bytes before the end of a message",
                        link.peer);
      }
      fail_link(link.peer, errno, keepalive_seconds_);
    }
  }
}

void TcpTransport::poll_links(const Deadline& deadline) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Link*, Stream*>> owners;
  bool awaiting = false;
  for (auto& link : links_) {
    for (Stream& stream : link->streams) {
      if (!stream.fd.valid()) {
        awaiting = awaiting || (link->awaiting() && !stream.queue.empty());
        continue;
      }
      short events = 0;
      if (link->sending && !stream.peer_closed) {
        // Nothing but a notice ever comes back on a send stream (a goodbye,
        // "gave up", or the end of the stream when the peer's process ended).
        events = POLLIN;
      }
      if (!stream.queue.empty()) events |= link->sending ? POLLOUT : POLLIN;
      // A stream whose peer said goodbye is still watched for a reset (events 0:
      // poll reports only errors): its end refuses what we sent and it had not
      // read, which a wait on another link would otherwise never hear of.
      const bool watch_reset = link->sending && stream.peer_closed && !stream.failed;
      if (events || watch_reset) {
        fds.push_back({stream.fd.get(), events, 0});
        owners.emplace_back(link.get(), &stream);
      }
    }
  }
  const size_t links = fds.size();
  if (wake_fd_.valid()) fds.push_back({wake_fd_.get(), POLLIN, 0});
  if (awaiting || !arrivals_.empty()) {
    // A connection we wait for, or the rest of a Hello.
    if (listener_.valid()) fds.push_back({listener_.get(), POLLIN, 0});
    for (auto& a : arrivals_) fds.push_back({a->fd.get(), POLLIN, 0});
  }
  if (::poll(fds.data(), fds.size(), deadline.poll_ms(100)) <= 0) return;
  if (wake_fd_.valid() && fds[links].revents) {
    uint64_t count = 0;
    ssize_t ignored = ::read(wake_fd_.get(), &count, sizeof count);
    (void)ignored;
  }
  for (size_t i = 0; i < links; ++i) {
    auto [link, stream] = owners[i];
    if (!link->sending || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (stream->peer_closed) {
      refused_after_goodbye(*link, *stream);
    } else {
      read_notice(*link, *stream);
    }
  }
}

void TcpTransport::refused_after_goodbye(const Link& link, Stream& stream) {
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(stream.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  stream.failed = true;  // reset or hung up: never watched or used again
  if (err == 0) return;  // closed both ways with nothing of ours unread
  note(link, err);
  throw PeerError(errno_message("rank " + std::to_string(link.peer) +
                                    " closed its communicator (it said goodbye) with data rank " +
                                    std::to_string(rank_) +
                                    " sent it unread: a collective it did not finish",
                                err),
                  link.peer);
}

void TcpTransport::read_notice(const Link& link, Stream& stream) {
  char notice = 0;
  const ssize_t k = ::recv(stream.fd.get(), &notice, 1, MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const std::string who = "rank " + std::to_string(link.peer);
  if (k == 1 && notice == tcp::kGoodbye) {
    stream.peer_closed = true;  // it closed its communicator: harmless unless we send again
    return;
  }
  if (k == 1 && notice == tcp::kGaveUp) {
    note(link, 0);
    stream.notice_read = true;  // the stream itself is sound: a shrink may take it over
    throw PeerError(who + " gave up on the communicator (it failed, was interrupted or aborted)",
                    link.peer);
  }
  if (k != 1 && link.peer != ring_right_) {
    // Off the ring nobody counts on us to pass the news on: as before, the end
    // of the stream is harmless until we send there again.
    stream.peer_closed = true;
    return;
  }
  note(link, k < 0 ? errno : 0);
  stream.failed = true;
  if (k == 1) {
    throw PeerError(who + " sent " + std::to_string(static_cast<unsigned char>(notice)) +
                        " back on a link it only receives on: not a notice of this protocol",
                    link.peer);
  }
  if (k < 0) fail_link(link.peer, errno, keepalive_seconds_);
  throw PeerError(who +
                      "'s process ended (killed, crashed, or exited without closing its "
                      "communicator): it closed the connection rank " +
                      std::to_string(rank_) + " sends to it on without a goodbye",
                  link.peer);
}

// The waiter's view of one wait: progress is bytes moved on the awaited
// request's link; a peer that is gone shows as an error or end of stream on
// its socket, in progress(); sleeping is in poll() on the links. Spinning
// yields the CPU between rounds: the peer we wait for may need it (on an
// oversubscribed host it is often runnable on our core).
struct TcpTransport::Waiting final : Waitable {
  // `link`: the awaited request's, or null while its peer has not connected.
  Waiting(TcpTransport& t, Request& request, const Link* link)
      : t(t), request(request), link(link) {}
  bool done() const override { return request.done(); }
  void progress() override { t.progress(); }
  uint64_t moved() const override { return link != nullptr ? link->moved : 0; }
  void pause() override { sched_yield(); }
  void block(uint32_t, std::chrono::microseconds bound) override {
    t.poll_links(Deadline::after(std::chrono::duration<double>(bound).count()));
  }
  void check_peer() override { t.check_gone(request); }
  void timed_out(const Deadline& window) override { t.fail_timeout(request, window); }
  bool woken() const override { return t.wakes_.load() != wakes; }
  WaitContext context() const override { return {t.rank_, request.what(), t.name()}; }

  TcpTransport& t;
  Request& request;
  const Link* link;
  const uint64_t wakes = t.wakes_.load();
};

uint64_t TcpTransport::moved(int peer, bool sending) const {
  for (const auto& link : links_) {
    if (link->peer == peer && link->sending == sending) return link->moved;
  }
  return 0;
}

void TcpTransport::wait(Request& request, const Deadline& deadline) {
  if (request.done()) return;
  const auto& awaited = static_cast<const Op&>(request);
  Waiting waiting(*this, request, &link_to(awaited.peer_, awaited.sending_));
  WaitPolicy policy;
  // Small messages complete within microseconds, far less than a sleep in
  // poll() and the wake-up after it: retry for a short while first.
  policy.spin = eager_ ? std::chrono::duration_cast<std::chrono::microseconds>(spin_)
                       : std::chrono::microseconds(0);
  policy.rounds_per_look = 1;
  // Liveness is the sockets' (in progress), and for a link not yet connected
  // the peer's notice in the store (check_gone, itself rate-limited).
  policy.looks_per_check = 1u << 30;
  wait_until_done(waiting, deadline, policy);
}

bool TcpTransport::progress() {
  uint64_t before = stats_.bytes_sent + stats_.bytes_received;
  bool awaiting = !arrivals_.empty();
  for (auto& link : links_) awaiting = awaiting || link->awaiting();
  if (awaiting) accept_arrivals();
  for (auto& link : links_) progress(*link);
  return stats_.bytes_sent + stats_.bytes_received != before;
}

bool TcpTransport::wait_for(Request& request, std::chrono::microseconds slice) {
  if (request.done()) return true;
  const auto& awaited = static_cast<const Op&>(request);
  // No spinning: the caller serves other requests or transports between slices.
  Waiting waiting(*this, request, find_link(awaited.peer_, awaited.sending_));
  WaitPolicy policy;
  policy.looks_per_check = 1u << 30;  // liveness is the sockets' (see wait())
  return wait_slice(waiting, slice, policy);
}

// Both ways, now: we only send to the right neighbour and receive from the
// left, so at three ranks or more no peer is reached both ways until a
// collective connects more.
bool TcpTransport::reaches(int peer) const {
  bool to = false;
  bool from = false;
  for (const auto& link : links_) {
    if (link->peer == peer && !link->awaiting()) (link->sending ? to : from) = true;
  }
  return to && from;
}

bool TcpTransport::connects(int peer) const {
  return store_ != nullptr ? peer >= 0 && peer < size_ && peer != rank_ : reaches(peer);
}

void TcpTransport::fail_timeout(const Request& request, const Deadline& deadline) {
  const auto& op = static_cast<const Op&>(request);
  const Link* link = find_link(op.peer_, op.sending_);
  if (cause_ == Cause::kNone) cause_ = Cause::kSilent;
  if (link != nullptr && link->awaiting()) {
    throw TimeoutError("rank " + std::to_string(op.peer_) + " did not connect to rank " +
                           std::to_string(rank_) + " within " + format_seconds(deadline.seconds()) +
                           " s to send it " + std::to_string(op.total) + " bytes",
                       op.peer_);
  }
  throw_no_progress(deadline, op.what(), name(), op.peer_,
                    " (" + std::to_string(op.total - op.left) + " done)");
}

namespace {

// How often a wait for a link the peer has not connected yet looks for its notice.
constexpr std::chrono::milliseconds kGoneCheck{100};

std::string gone_key(const std::string& prefix, int rank) {
  return prefix + "gone/" + std::to_string(rank);
}

}  // namespace

void TcpTransport::check_gone(const Request& request) {
  if (store_ == nullptr) return;
  const auto& op = static_cast<const Op&>(request);
  const Link* link = find_link(op.peer_, op.sending_);
  if (link != nullptr && !link->awaiting()) return;  // its socket will tell
  const Clock::time_point now = Clock::now();
  if (now < next_gone_check_) return;
  next_gone_check_ = now + kGoneCheck;
  std::optional<std::string> notice;
  try {
    notice = store_->try_get(gone_key(prefix_, op.peer_));
  } catch (const Error&) {
    return;  // the store is out of reach: the wait's own deadline still holds
  }
  if (notice) {
    throw PeerError("rank " + std::to_string(op.peer_) +
                        " gave up on the communicator (it failed or was interrupted) before it "
                        "connected",
                    op.peer_);
  }
}

void TcpTransport::abort() noexcept {
  if (store_ != nullptr && listener_.valid()) {
    try {
      store_->set(gone_key(prefix_, rank_), "1");
    } catch (...) {
      // Best effort: the peers' deadlines still hold.
    }
  }
  park();
}

void TcpTransport::park() noexcept {
  if (ring_right_ < 0) {
    tear_down();  // no ring (point-to-point links): closing tells each peer
    return;
  }
  listener_.reset();
  arrivals_.clear();
  if (parked_) return;
  parked_ = true;
  // Our "gave up" goes to the left; the right neighbour hears of the failure from
  // its own right, unless the news cannot come round that way: a rank that stays
  // silent (stopped, cut off) stops it. Then (kSilent: see note() and
  // note_silent()) the link to the right is reset instead of parked, which tells
  // that rank, and the reset travels on.
  const bool keep_right = cause_ != Cause::kSilent;
  for (auto& link : links_) {
    const bool ring = link->peer == (link->sending ? ring_right_ : ring_left_);
    for (Stream& stream : link->streams) {
      stream.queue.clear();
      if (!stream.fd.valid()) continue;
      // Every receiving end says it gave up; ring links then stay open.
      const bool told = !link->sending && !stream.failed && send_notice(stream, tcp::kGaveUp);
      const bool keep =
          ring && !stream.failed && !stream.peer_closed && (link->sending ? keep_right : told);
      if (keep) continue;
      if (ring && link->sending) {
        const linger now{1, 0};  // a reset, not an end of stream: see note()
        ::setsockopt(stream.fd.get(), SOL_SOCKET, SO_LINGER, &now, sizeof now);
      } else {
        ::shutdown(stream.fd.get(), SHUT_RDWR);
      }
      stream.fd.reset();
    }
  }
}

void TcpTransport::note(const Link& link, int err) {
  if (cause_ != Cause::kNone) return;
  const bool reset_from_left = !link.sending && link.peer == ring_left_ && err == ECONNRESET;
  const bool unreachable = err != 0 && unreachable_errno(err) && keepalive_seconds_ > 0;
  cause_ = reset_from_left || unreachable ? Cause::kSilent : Cause::kKnown;
}

bool TcpTransport::send_notice(Stream& stream, char notice) noexcept {
  if (::send(stream.fd.get(), &notice, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return false;
  stream.notice_sent = true;
  return true;
}

void TcpTransport::tear_down() noexcept {
  listener_.reset();
  arrivals_.clear();
  for (auto& link : links_) {
    for (Stream& stream : link->streams) {
      stream.queue.clear();
      if (stream.fd.valid()) {
        // The sender then knows the end of the stream is no death.
        if (!link->sending && !stream.notice_sent) send_notice(stream, tcp::kGoodbye);
        ::shutdown(stream.fd.get(), SHUT_RDWR);
        stream.fd.reset();
      }
    }
  }
}

}  // namespace rr
