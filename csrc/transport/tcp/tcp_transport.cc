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
    Link& link = link_to(op->peer_, op->sending);
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
    progress(link);
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
        (link.sending ? stats_.bytes_sent : stats_.bytes_received) += static_cast<uint64_t>(k);
        if (p.left == 0) stream.queue.pop_front();
        continue;
      }
      if (k == 0 && !link.sending) {
        throw PeerError("rank " + std::to_string(link.peer) +
                            " closed its connection (it exited, crashed or aborted) while rank " +
                            std::to_string(rank_) + " expected " + std::to_string(p.op->left) +
                            " more bytes from it",
                        link.peer);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (unreachable_errno(errno) && keepalive_seconds_ > 0) {
        throw PeerError("rank " + std::to_string(link.peer) +
                            "'s machine stopped answering: no reply to TCP keepalive probes "
                            "for " +
                            std::to_string(keepalive_seconds_) +
                            " s (a network partition, or its host froze or lost power; "
                            "RINGREDUCE_TCP_KEEPALIVE sets how long)",
                        link.peer, kUnreachable);
      }
      throw PeerError(
          errno_message("connection to rank " + std::to_string(link.peer) + " failed", errno),
          link.peer);
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
      if (!stream.queue.empty()) {
        events = link->sending ? POLLOUT : POLLIN;
      } else if (link->sending && !stream.peer_closed) {
        // Nobody writes to us on a send stream, so readability means EOF or reset.
        events = POLLIN;
      }
      if (events) {
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
    if (link->sending && stream->queue.empty() && fds[i].revents) stream->peer_closed = true;
  }
}

// The waiter's view of one wait: progress is bytes moved on the awaited
// request's link; a peer that is gone shows as an error or end of stream on
// its socket, in progress(); sleeping is in poll() on the links. Spinning
// yields the CPU between rounds: the peer we wait for may need it (on an
// oversubscribed host it is often runnable on our core).
struct TcpTransport::Waiting final : Waitable {
  Waiting(TcpTransport& t, Request& request, Link& link) : t(t), request(request), link(link) {}
  bool done() const override { return request.done(); }
  void progress() override { t.progress(); }
  uint64_t moved() const override { return link.moved; }
  void pause() override { sched_yield(); }
  void block(uint32_t, std::chrono::microseconds bound) override {
    t.poll_links(Deadline::after(std::chrono::duration<double>(bound).count()));
  }
  void check_peer() override { t.check_gone(request); }
  void timed_out(const Deadline& window) override { t.fail_timeout(request, window); }

  TcpTransport& t;
  Request& request;
  Link& link;
};

void TcpTransport::wait(Request& request, const Deadline& deadline) {
  if (request.done()) return;
  const auto& awaited = static_cast<const Op&>(request);
  Waiting waiting(*this, request, link_to(awaited.peer_, awaited.sending));
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
  const Deadline until = Deadline::after(static_cast<double>(slice.count()) * 1e-6);
  const uint64_t wakes = wakes_.load();
  while (!request.done()) {
    progress();
    if (request.done() || until.expired() || wakes_.load() != wakes) break;
    check_gone(request);
    poll_links(until);
  }
  return request.done();
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
  const Link* link = find_link(op.peer_, op.sending);
  if (link != nullptr && link->awaiting()) {
    throw TimeoutError("rank " + std::to_string(op.peer_) + " did not connect to rank " +
                           std::to_string(rank_) + " within " + format_seconds(deadline.seconds()) +
                           " s to send it " + std::to_string(op.total) + " bytes",
                       op.peer_);
  }
  std::string what = op.sending ? "sending to" : "receiving from";
  throw TimeoutError("no progress for " + format_seconds(deadline.seconds()) + " s " + what +
                         " rank " + std::to_string(op.peer_) + " (" +
                         std::to_string(op.total - op.left) + " of " + std::to_string(op.total) +
                         " bytes done)",
                     op.peer_);
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
  const Link* link = find_link(op.peer_, op.sending);
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
                        "connected to rank " +
                        std::to_string(rank_),
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
  tear_down();
}

void TcpTransport::tear_down() noexcept {
  listener_.reset();
  arrivals_.clear();
  for (auto& link : links_) {
    for (Stream& stream : link->streams) {
      stream.queue.clear();
      if (stream.fd.valid()) {
        ::shutdown(stream.fd.get(), SHUT_RDWR);
        stream.fd.reset();
      }
    }
  }
}

}  // namespace rr
