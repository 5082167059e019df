#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace rr {

// A send or a receive in flight: `cursor` advances as the kernel takes bytes.
// A receive into a view owns its buffer (`slot`) until released.
struct TcpTransport::Op : Request {
  Op(int peer, char* data, size_t bytes, bool sending)
      : peer_(peer), cursor(data), left(bytes), total(bytes), sending(sending) {}
  bool done() const override { return left == 0; }
  int peer() const override { return peer_; }
  const char* view() const override { return slot && done() ? slot->data() : nullptr; }

  int peer_;
  char* cursor;
  size_t left;
  size_t total;
  bool sending;
  ViewPool::Slot slot;
};

// One direction of one connection, with its FIFO of posted operations.
struct TcpTransport::Link {
  Link(int peer, bool sending, Fd fd) : peer(peer), sending(sending), fd(std::move(fd)) {}

  int peer;
  bool sending;
  Fd fd;
  std::deque<std::shared_ptr<Op>> queue;
  // The peer closed a link we only send on. Harmless unless we send again.
  bool peer_closed = false;
  // Bytes moved on this link so far: how wait() tells progress from a stall.
  uint64_t moved = 0;
  // Buffers of released views, reused by the next irecv_view.
  ViewPool views;
};

namespace {

constexpr uint32_t kHelloMagic = 0x52524831;  // "RRH1"

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t session;
};

std::string peer_name(int peer) { return "rank " + std::to_string(peer); }

std::pair<std::string, int> split_host_port(const std::string& addr) {
  auto colon = addr.rfind(':');
  return {addr.substr(0, colon), std::stoi(addr.substr(colon + 1))};
}

}  // namespace

std::string local_ip_towards(const std::string& host) {
  // connect() on a UDP socket only picks a route; it sends nothing.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return "127.0.0.1";
  Fd fd(::socket(AF_INET, SOCK_DGRAM, 0));
  std::string ip = "127.0.0.1";
  if (fd.valid() && ::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0) {
    ip = local_ip(fd.get());
  }
  ::freeaddrinfo(res);
  return ip;
}

TcpTransport::TcpTransport(int rank, int size, std::chrono::microseconds spin)
    : rank_(rank), size_(size), spin_(spin) {}
TcpTransport::~TcpTransport() = default;

std::unique_ptr<TcpTransport> TcpTransport::connect_ring(Store& store, const std::string& prefix,
                                                         int rank, int size,
                                                         const std::string& advertise_host,
                                                         std::chrono::microseconds spin,
                                                         const Deadline& deadline) {
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size, spin));
  if (size == 1) return t;

  // Every rank learns one session number from rank 0, so a stale connection
  // from an earlier job on the same port is recognised and dropped.
  uint64_t session = 0;
  if (rank == 0) {
    session = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
              (static_cast<uint64_t>(::getpid()) << 32);
    store.set(prefix + "session", std::to_string(session));
  } else {
    session = std::stoull(store.get(prefix + "session", deadline));
  }

  Fd listener = listen_tcp("", 0);
  store.set(prefix + "addr/" + std::to_string(rank),
            advertise_host + ":" + std::to_string(bound_port(listener.get())));

  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;

  // Connect first: the kernel completes the handshake from the listener's
  // backlog even before the neighbour calls accept(), so this cannot deadlock.
  auto [host, port] =
      split_host_port(store.get(prefix + "addr/" + std::to_string(right), deadline));
  Fd out = connect_tcp(host, port, deadline, peer_name(right));
  Hello hello{kHelloMagic, rank, session};
  send_exact(out.get(), &hello, sizeof hello, deadline, right, peer_name(right));

  Fd in;
  while (!in.valid()) {
    Fd candidate = accept_tcp(listener.get(), deadline, peer_name(left));
    Hello theirs{};
    try {
      recv_exact(candidate.get(), &theirs, sizeof theirs, deadline, left, peer_name(left));
    } catch (const PeerError&) {
      continue;  // a connection that died before saying hello is not our neighbour
    }
    if (theirs.magic == kHelloMagic && theirs.rank == left && theirs.session == session) {
      in = std::move(candidate);
    }
  }

  t->links_.push_back(std::make_unique<Link>(right, true, std::move(out)));
  t->links_.push_back(std::make_unique<Link>(left, false, std::move(in)));
  return t;
}

TcpTransport::Link& TcpTransport::link_to(int peer, bool sending) {
  for (auto& link : links_) {
    if (link->peer == peer && link->sending == sending) return *link;
  }
  throw Error("tcp transport: rank " + std::to_string(rank_) + " has no link to " +
              (sending ? "send to" : "receive from") + " rank " + std::to_string(peer) +
              " (only ring neighbours are connected)");
}

RequestPtr TcpTransport::post(std::shared_ptr<Op> op) {
  if (op->total > 0) {
    Link& link = link_to(op->peer_, op->sending);
    if (!link.fd.valid()) {
      throw PeerError("connection to rank " + std::to_string(op->peer_) + " is closed", op->peer_);
    }
    link.queue.push_back(op);
    // Start moving bytes now: small messages often complete right here.
    progress(link);
  }
  return op;
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
  while (!link.queue.empty()) {
    Op& op = *link.queue.front();
    ssize_t k = link.sending
                    ? ::send(link.fd.get(), op.cursor, op.left, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : ::recv(link.fd.get(), op.cursor, op.left, MSG_DONTWAIT);
    if (k > 0) {
      op.cursor += k;
      op.left -= static_cast<size_t>(k);
      link.moved += static_cast<uint64_t>(k);
      (link.sending ? stats_.bytes_sent : stats_.bytes_received) += static_cast<uint64_t>(k);
      if (op.left == 0) link.queue.pop_front();
      continue;
    }
    if (k == 0 && !link.sending) {
      throw PeerError("rank " + std::to_string(link.peer) +
                          " closed its connection (it exited, crashed or aborted) while rank " +
                          std::to_string(rank_) + " expected " + std::to_string(op.left) +
                          " more bytes from it",
                      link.peer);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    throw PeerError(
        errno_message("connection to rank " + std::to_string(link.peer) + " failed", errno),
        link.peer);
  }
}

void TcpTransport::poll_links(const Deadline& deadline) {
  std::vector<pollfd> fds;
  std::vector<Link*> owners;
  for (auto& link : links_) {
    if (!link->fd.valid()) continue;
    short events = 0;
    if (!link->queue.empty()) {
      events = link->sending ? POLLOUT : POLLIN;
    } else if (link->sending && !link->peer_closed) {
      // Nobody writes to us on a send link, so readability means EOF or reset.
      events = POLLIN;
    }
    if (events) {
      fds.push_back({link->fd.get(), events, 0});
      owners.push_back(link.get());
    }
  }
  if (::poll(fds.data(), fds.size(), deadline.poll_ms(100)) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    Link& link = *owners[i];
    if (link.sending && link.queue.empty() && fds[i].revents) link.peer_closed = true;
  }
}

void TcpTransport::wait(Request& request, const Deadline& deadline) {
  // Small messages complete within microseconds, far less than a sleep in
  // poll() and the wake-up after it. So first retry for a short while,
  // yielding the CPU between attempts (the peer we wait for may need it: on
  // an oversubscribed host it is often runnable on our core), and only then
  // block in poll().
  const Clock::time_point spin_until = Clock::now() + (eager_ ? spin_ : Clock::duration(0));
  // The deadline bounds time without progress, not the whole transfer: a
  // large message on a slow link may take longer than the timeout, a stalled
  // peer may not. Every byte moved on the awaited request's link restarts the
  // window; traffic on other links does not, so the rank that waits on a
  // stalled peer is the first to time out and can name it.
  const auto& awaited = static_cast<const Op&>(request);
  Link* link_awaited = request.done() ? nullptr : &link_to(awaited.peer_, awaited.sending);
  Deadline window = deadline;
  uint64_t moved = link_awaited ? link_awaited->moved : 0;
  while (!request.done()) {
    progress();
    if (request.done()) break;
    if (link_awaited->moved != moved) {
      moved = link_awaited->moved;
      window = deadline.renewed();
    }
    if (window.expired()) fail_timeout(request, window);
    if (Clock::now() < spin_until) {
      sched_yield();
    } else {
      poll_links(window);
    }
  }
}

bool TcpTransport::progress() {
  uint64_t before = stats_.bytes_sent + stats_.bytes_received;
  for (auto& link : links_) progress(*link);
  return stats_.bytes_sent + stats_.bytes_received != before;
}

bool TcpTransport::wait_for(Request& request, std::chrono::microseconds slice) {
  const Deadline until = Deadline::after(static_cast<double>(slice.count()) * 1e-6);
  while (!request.done()) {
    progress();
    if (request.done() || until.expired()) break;
    poll_links(until);
  }
  return request.done();
}

// Both ways: we only send to the right neighbour and receive from the left,
// so at three ranks or more no peer is reached both ways.
bool TcpTransport::reaches(int peer) const {
  bool to = false;
  bool from = false;
  for (const auto& link : links_) {
    if (link->peer == peer) (link->sending ? to : from) = true;
  }
  return to && from;
}

void TcpTransport::fail_timeout(const Request& request, const Deadline& deadline) {
  const auto& op = static_cast<const Op&>(request);
  std::string what = op.sending ? "sending to" : "receiving from";
  throw TimeoutError("no progress for " + format_seconds(deadline.seconds()) + " s " + what +
                         " rank " + std::to_string(op.peer_) + " (" +
                         std::to_string(op.total - op.left) + " of " + std::to_string(op.total) +
                         " bytes done)",
                     op.peer_);
}

void TcpTransport::abort() noexcept {
  for (auto& link : links_) {
    link->queue.clear();
    if (link->fd.valid()) {
      ::shutdown(link->fd.get(), SHUT_RDWR);
      link->fd.reset();
    }
  }
}

}  // namespace rr
