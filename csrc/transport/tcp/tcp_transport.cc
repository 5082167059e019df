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

namespace rr {

// A send or a receive in flight: `left` falls as the kernel takes its bytes,
// on whichever streams its pieces went to. A receive into a view owns its
// buffer (`slot`) until released.
struct TcpTransport::Op : Request {
  Op(int peer, char* data, size_t bytes, bool sending)
      : peer_(peer), data(data), left(bytes), total(bytes), sending(sending) {}
  bool done() const override { return left == 0; }
  int peer() const override { return peer_; }
  const char* view() const override { return slot && done() ? slot->data() : nullptr; }

  int peer_;
  char* data;
  size_t left;
  size_t total;
  bool sending;
  ViewPool::Slot slot;
};

// The bytes of an Op that one stream carries; `cursor` advances as they move.
struct TcpTransport::Piece {
  std::shared_ptr<Op> op;
  char* cursor;
  size_t left;
};

// One connection of a link, with its FIFO of pieces.
struct TcpTransport::Stream {
  Fd fd;
  std::deque<Piece> queue;
  // The peer closed a stream we only send on. Harmless unless we send again.
  bool peer_closed = false;
};

// One direction between us and a peer: one or more streams.
struct TcpTransport::Link {
  Link(int peer, bool sending, int streams)
      : peer(peer), sending(sending), streams(static_cast<size_t>(streams)) {}

  // A receiving link some of whose streams the peer has not connected yet:
  // pieces queue until accept_arrivals() finds their connections.
  bool awaiting() const { return arrived < streams.size(); }

  int peer;
  bool sending;
  std::vector<Stream> streams;
  size_t arrived = 0;     // streams connected so far
  uint64_t messages = 0;  // messages posted so far: which stream(s) the next one takes
  // Bytes moved on this link so far: how wait() tells progress from a stall.
  uint64_t moved = 0;
  // Buffers of released views, reused by the next irecv_view.
  ViewPool views;
};

namespace {

// Connections waiting to say hello, at most: more (a flood of strangers) are
// closed at once.
constexpr size_t kMaxArrivals = 1024;

// Messages from this size are cut across every stream of a link, into pieces
// of whole pages.
constexpr size_t kStripeMinBytes = 64 << 10;
constexpr size_t kStripeAlign = 4096;

std::string peer_name(int peer) { return "rank " + std::to_string(peer); }

std::string addr_key(const std::string& prefix, int rank) {
  return prefix + "addr/" + std::to_string(rank);
}

std::string streams_key(const std::string& prefix, int rank) {
  return prefix + "streams/" + std::to_string(rank);
}

std::pair<std::string, int> split_host_port(const std::string& addr) {
  auto colon = addr.rfind(':');
  return {addr.substr(0, colon), std::stoi(addr.substr(colon + 1))};
}

}  // namespace

// A connection accepted on our listener, until its Hello says who it is.
struct TcpTransport::Arrival {
  explicit Arrival(Fd fd) : fd(std::move(fd)) {}
  Fd fd;
  LinkHello hello{};
  size_t got = 0;
};

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

int default_tcp_streams(const std::string& local_ip) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return 1;
  std::string nic;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char ip[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip) != nullptr && local_ip == ip) {
      nic = a->ifa_name;
      break;
    }
  }
  ::freeifaddrs(all);
  if (nic.empty() || nic.find('/') != std::string::npos) return 1;
  long mbit = 0;
  if (FILE* f = std::fopen(("/sys/class/net/" + nic + "/speed").c_str(), "r")) {
    if (std::fscanf(f, "%ld", &mbit) != 1) mbit = 0;
    std::fclose(f);
  }
  return mbit >= 100000 ? 8 : mbit >= 40000 ? 4 : mbit >= 25000 ? 2 : 1;
}

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

std::unique_ptr<TcpTransport> TcpTransport::listen(Store& store, const std::string& prefix,
                                                   int rank, int size,
                                                   const std::string& advertise_host,
                                                   std::chrono::microseconds spin,
                                                   const Deadline& deadline,
                                                   const std::string& token, int streams) {
  if (streams < 1 || streams > kMaxLinkStreams) {
    throw InvalidArgument("tcp transport: " + std::to_string(streams) +
                          " streams per link asked for; 1 to " + std::to_string(kMaxLinkStreams) +
                          " are possible");
  }
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size, spin));
  t->token_ = token;
  t->streams_ = streams;
  if (size == 1) return t;

  // Every rank learns one session number from rank 0, so a stale connection
  // from an earlier job on the same port is recognised and dropped.
  if (rank == 0) {
    t->session_ = random_u64();
    store.set(prefix + "session", std::to_string(t->session_));
  } else {
    t->session_ = std::stoull(store.get(prefix + "session", deadline));
  }
  // The listener stays open: ranks other than our left neighbour connect
  // when they first send to us.
  // Peers on this host only (a loopback address advertised): loopback only.
  const bool loopback = advertise_host.rfind("127.", 0) == 0 || advertise_host == "localhost";
  t->listener_ = listen_tcp(loopback ? "127.0.0.1" : "", 0, 1024);
  // Before the address: whoever reads the address finds the streams too.
  store.set(streams_key(prefix, rank), std::to_string(streams));
  store.set(addr_key(prefix, rank),
            advertise_host + ":" + std::to_string(bound_port(t->listener_.get())));
  t->store_ = &store;
  t->prefix_ = prefix;
  t->connect_seconds_ = deadline.seconds();
  return t;
}

std::unique_ptr<TcpTransport> TcpTransport::connect_lazy(
    Store& store, const std::string& prefix, int rank, int size, const std::string& advertise_host,
    std::chrono::microseconds spin, const Deadline& deadline, const std::string& token) {
  return listen(store, prefix, rank, size, advertise_host, spin, deadline, token, 1);
}

std::unique_ptr<TcpTransport> TcpTransport::connect_ring(Store& store, const std::string& prefix,
                                                         int rank, int size,
                                                         const std::string& advertise_host,
                                                         std::chrono::microseconds spin,
                                                         const Deadline& deadline,
                                                         const std::string& token, int streams) {
  std::unique_ptr<TcpTransport> t =
      listen(store, prefix, rank, size, advertise_host, spin, deadline, token, streams);
  if (size == 1) return t;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;

  // Connect first: the kernel completes the handshake from the listener's
  // backlog even before the neighbour calls accept(), so this cannot deadlock.
  t->connect_to(right, deadline);

  while (true) {
    const Link* in = t->find_link(left, false);
    if (in != nullptr && !in->awaiting()) break;
    Fd candidate = accept_tcp(t->listener_.get(), deadline, peer_name(left));
    LinkHello theirs{};
    try {
      recv_exact(candidate.get(), &theirs, sizeof theirs, deadline, left, peer_name(left));
    } catch (const PeerError&) {
      continue;  // a connection that died before saying hello is not our neighbour
    }
    if (!t->accept_hello(theirs)) continue;
    // The left neighbour, or another rank already sending to us (its first
    // all_to_all, say): kept either way.
    t->adopt(std::move(candidate), theirs);
  }
  return t;
}

TcpTransport::Link& TcpTransport::connect_to(int peer, const Deadline& deadline) {
  auto [host, port] = split_host_port(store_->get(addr_key(prefix_, peer), deadline));
  const std::string count = store_->get(streams_key(prefix_, peer), deadline);
  const int streams = std::atoi(count.c_str());
  if (streams < 1 || streams > kMaxLinkStreams) {
    throw Error("tcp transport: rank " + std::to_string(peer) + " asks for " + count +
                " streams per link (1 to " + std::to_string(kMaxLinkStreams) + " are possible)");
  }
  auto link = std::make_unique<Link>(peer, true, streams);
  for (int i = 0; i < streams; ++i) {
    Fd out = connect_tcp(host, port, deadline, peer_name(peer));
    const LinkHello hello = make_link_hello(rank_, peer, session_, token_, i, streams);
    send_exact(out.get(), &hello, sizeof hello, deadline, peer, peer_name(peer));
    link->streams[static_cast<size_t>(i)].fd = std::move(out);
  }
  link->arrived = link->streams.size();
  links_.push_back(std::move(link));
  return *links_.back();
}

void TcpTransport::adopt(Fd fd, const LinkHello& h) {
  Link* link = find_link(h.rank, false);
  if (link == nullptr) {
    links_.push_back(std::make_unique<Link>(h.rank, false, streams_));
    link = links_.back().get();
  }
  if (h.streams != link->streams.size()) {
    std::fprintf(stderr,
                 "ringreduce: rank %d refused a connection from rank %d: it opens %d streams per "
                 "link, rank %d takes %zu\n",
                 rank_, h.rank, h.streams, rank_, link->streams.size());
    return;
  }
  Stream& stream = link->streams[h.stream];
  if (stream.fd.valid()) return;  // that stream is connected already: a duplicate
  stream.fd = std::move(fd);
  ++link->arrived;
}

bool TcpTransport::accept_hello(const LinkHello& h) {
  std::string why = check_link_hello(h, rank_, size_, session_, token_);
  if (why.empty() && !nonces_seen_.insert(std::string(bytes_of(h.nonce))).second) {
    why = "a replayed hello";
  }
  if (why.empty()) return true;
  // A stale connection from an earlier job is routine; anything else is worth a line.
  if (h.magic != kLinkHelloMagic || h.session != session_) return false;
  std::fprintf(stderr, "ringreduce: rank %d refused a connection: %s\n", rank_, why.c_str());
  return false;
}

TcpTransport::Link* TcpTransport::find_link(int peer, bool sending) {
  for (auto& link : links_) {
    if (link->peer == peer && link->sending == sending) return link.get();
  }
  return nullptr;
}

TcpTransport::Link& TcpTransport::link_to(int peer, bool sending) {
  if (Link* link = find_link(peer, sending)) return *link;
  if (store_ == nullptr || peer < 0 || peer >= size_ || peer == rank_) {
    throw Error("tcp transport: rank " + std::to_string(rank_) + " has no link to " +
                (sending ? "send to" : "receive from") + " rank " + std::to_string(peer));
  }
  if (!sending) {
    // The peer connects when it first sends to us; until then receives queue.
    links_.push_back(std::make_unique<Link>(peer, false, streams_));
    Link& link = *links_.back();
    accept_arrivals();
    return link;
  }
  return connect_to(peer, Deadline::after(connect_seconds_));
}

void TcpTransport::accept_arrivals() {
  if (!listener_.valid()) return;
  while (true) {
    int fd = ::accept(listener_.get(), nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      throw Error(errno_message("rank " + std::to_string(rank_) + ": accept()", errno));
    }
    if (arrivals_.size() >= kMaxArrivals) {
      ::close(fd);
      continue;
    }
    set_nonblocking(fd);
    tune_stream_socket(fd);
    arrivals_.push_back(std::make_unique<Arrival>(Fd(fd)));
  }
  for (size_t i = 0; i < arrivals_.size();) {
    Arrival& a = *arrivals_[i];
    ssize_t k = ::recv(a.fd.get(), reinterpret_cast<char*>(&a.hello) + a.got,
                       sizeof a.hello - a.got, MSG_DONTWAIT);
    if (k > 0) a.got += static_cast<size_t>(k);
    const bool dead =
        k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (!dead && a.got < sizeof a.hello) {
      ++i;
      continue;
    }
    const LinkHello h = a.hello;
    Fd fd = std::move(a.fd);
    arrivals_.erase(arrivals_.begin() + static_cast<std::ptrdiff_t>(i));
    // Not one of this job's ranks (a stale connection from an earlier job on
    // a reused port, a port scanner, a process without the token): dropped.
    if (dead || !accept_hello(h)) continue;
    adopt(std::move(fd), h);
  }
}

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

void TcpTransport::abort() noexcept {
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
