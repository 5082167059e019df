// The TCP transport's links: listening, connecting to a peer (several
// streams per link), and the hellos that say who a connection is from.
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
#include "transport/tcp/tcp_transport.h"

namespace rr {

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

std::unique_ptr<TcpTransport> TcpTransport::listen(
    Store& store, const std::string& prefix, int rank, int size, const std::string& advertise_host,
    std::chrono::microseconds spin, const Deadline& deadline, const std::string& token, int streams,
    int keepalive_seconds) {
  if (streams < 1 || streams > kMaxLinkStreams) {
    throw InvalidArgument("tcp transport: " + std::to_string(streams) +
                          " streams per link asked for; 1 to " + std::to_string(kMaxLinkStreams) +
                          " are possible");
  }
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size, spin));
  t->token_ = token;
  t->streams_ = streams;
  t->keepalive_seconds_ = keepalive_seconds;
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
  store.set(addr_key(prefix, rank),
            link_record(streams, advertise_host, bound_port(t->listener_.get())));
  t->store_ = &store;
  t->prefix_ = prefix;
  t->connect_seconds_ = deadline.seconds();
  return t;
}

std::unique_ptr<TcpTransport> TcpTransport::connect_lazy(
    Store& store, const std::string& prefix, int rank, int size, const std::string& advertise_host,
    std::chrono::microseconds spin, const Deadline& deadline, const std::string& token,
    int keepalive_seconds) {
  std::unique_ptr<TcpTransport> t = listen(store, prefix, rank, size, advertise_host, spin,
                                           deadline, token, 1, keepalive_seconds);
  // Every peer's address, read now: a first message between two ranks then needs
  // nobody else, not even rank 0 (whose store may be gone by then, closed or dead).
  t->records_.resize(static_cast<size_t>(size));
  std::vector<int> peers(static_cast<size_t>(size));
  for (int peer = 0; peer < size; ++peer) peers[static_cast<size_t>(peer)] = peer;
  std::vector<std::string> records =
      get_of_ranks(store, addr_prefix(prefix), peers, rank, deadline);
  for (int peer = 0, next = 0; peer < size; ++peer) {
    if (peer != rank) t->records_[static_cast<size_t>(peer)] = std::move(records[next++]);
  }
  return t;
}

std::unique_ptr<TcpTransport> TcpTransport::connect_ring(
    Store& store, const std::string& prefix, int rank, int size, const std::string& advertise_host,
    std::chrono::microseconds spin, const Deadline& deadline, const std::string& token, int streams,
    int keepalive_seconds, const TcpReuse* reuse) {
  std::unique_ptr<TcpTransport> t = listen(store, prefix, rank, size, advertise_host, spin,
                                           deadline, token, streams, keepalive_seconds);
  if (size == 1) return t;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  t->ring_right_ = right;
  t->ring_left_ = left;

  bool kept_right = false;
  if (reuse != nullptr) {
    if (static_cast<int>(reuse->old_ranks.size()) != size) {
      throw InvalidArgument("tcp transport: a reuse needs the old rank of each of the " +
                            std::to_string(size) + " ranks, got " +
                            std::to_string(reuse->old_ranks.size()));
    }
    // Every rank publishes its parked links (none, when its communicator was not
    // revoked) before reading its neighbours': nobody waits on anything else.
    const std::string key = prefix + "parked/";
    const std::string mine = reuse->parent != nullptr ? reuse->parent->parked_record() : "v1;";
    store.set(key + std::to_string(rank), mine);
    const std::vector<std::string> both = store.get_all(
        {key + std::to_string(right), key + std::to_string(left)}, deadline, {right, left});
    const std::string& of_right = both[0];
    const std::string& of_left = both[1];
    kept_right = t->reuse_link(*reuse, right, true, mine, of_right, deadline);
    t->reuse_link(*reuse, left, false, mine, of_left, deadline);
  }

  // Connect first: the kernel completes the handshake from the listener's
  // backlog even before the neighbour calls accept(), so this cannot deadlock.
  if (!kept_right) t->connect_to(right, deadline);

  while (true) {
    const Link* in = t->find_link(left, false);
    if (in != nullptr && !in->awaiting()) break;
    Fd candidate = accept_tcp(t->listener_.get(), deadline, peer_name(left), left);
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
  const size_t p = static_cast<size_t>(peer);
  const std::string record = p < records_.size() && !records_[p].empty()
                                 ? records_[p]
                                 : store_->get(addr_key(prefix_, peer), deadline, peer);
  const auto [host, port, streams] = parse_link_record(record);
  if (streams < 1 || streams > kMaxLinkStreams || port <= 0) {
    throw Error("tcp transport: rank " + std::to_string(peer) + " published \"" + record +
                "\" as its address; expected \"<streams> <host>:<port>\" with 1 to " +
                std::to_string(kMaxLinkStreams) + " streams");
  }
  auto link = std::make_unique<Link>(peer, true, streams);
  for (int i = 0; i < streams; ++i) {
    Fd out = connect_tcp(host, port, deadline, peer_name(peer));
    set_keepalive(out.get(), keepalive_seconds_);
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
  set_keepalive(fd.get(), keepalive_seconds_);
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

}  // namespace rr
