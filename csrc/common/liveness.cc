#include "common/liveness.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace rr {
namespace {

constexpr uint32_t kLivenessMagic = 0x52524c31;  // "RRL1"
constexpr char kGoodbye = 'B';

struct LivenessHello {
  uint32_t magic;
  int32_t rank;
  uint64_t instance;
};

}  // namespace

Liveness::Liveness(int rank, int size)
    : rank_(rank),
      size_(size),
      fds_(static_cast<size_t>(size)),
      states_(new std::atomic<State>[static_cast<size_t>(size)]),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  for (int r = 0; r < size; ++r) states_[static_cast<size_t>(r)] = State::kAlive;
}

std::unique_ptr<Liveness> Liveness::connect(int rank, int size, uint64_t instance,
                                            const std::string& advertise,
                                            const Allgather& allgather, const Deadline& deadline) {
  std::unique_ptr<Liveness> live(new Liveness(rank, size));
  Fd listener = listen_tcp(advertise, 0, std::max(128, size));
  const std::vector<std::string> addresses =
      allgather(advertise + ":" + std::to_string(bound_port(listener.get())));
  if (static_cast<int>(addresses.size()) != size) {
    throw Error("liveness: got " + std::to_string(addresses.size()) + " addresses for " +
                std::to_string(size) + " ranks");
  }
  // Connect up, accept down: a connect completes from the peer's backlog
  // before it accepts, so the order cannot deadlock.
  for (int peer = rank + 1; peer < size; ++peer) {
    const std::string& a = addresses[static_cast<size_t>(peer)];
    const size_t colon = a.rfind(':');
    if (colon == std::string::npos)
      throw Error("liveness: bad address from rank " + std::to_string(peer));
    Fd fd = connect_tcp(a.substr(0, colon), std::atoi(a.c_str() + colon + 1), deadline,
                        "rank " + std::to_string(peer) + "'s liveness socket");
    const LivenessHello hello{kLivenessMagic, rank, instance};
    send_exact(fd.get(), &hello, sizeof hello, deadline, peer, "rank " + std::to_string(peer));
    live->fds_[static_cast<size_t>(peer)] = std::move(fd);
  }
  for (int waiting = rank; waiting > 0;) {
    Fd fd = accept_tcp(listener.get(), deadline, "the lower ranks' liveness connections");
    LivenessHello hello{};
    try {
      recv_exact(fd.get(), &hello, sizeof hello, deadline, -1, "a liveness connection");
    } catch (const PeerError&) {
      continue;
    }
    // Anything but a lower rank of this communicator, once, is not ours.
    if (hello.magic != kLivenessMagic || hello.instance != instance || hello.rank < 0 ||
        hello.rank >= rank || live->fds_[static_cast<size_t>(hello.rank)].valid()) {
      continue;
    }
    live->fds_[static_cast<size_t>(hello.rank)] = std::move(fd);
    --waiting;
  }
  live->watcher_ = std::thread([l = live.get()] { l->watch(); });
  return live;
}

Liveness::~Liveness() {
  for (Fd& fd : fds_) {
    if (fd.valid()) (void)::send(fd.get(), &kGoodbye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    watcher_.join();
  }
}

void Liveness::watch() {
  std::vector<bool> said_goodbye(static_cast<size_t>(size_), false);
  while (true) {
    std::vector<pollfd> fds{{wake_.get(), POLLIN, 0}};
    std::vector<int> ranks{-1};
    for (int r = 0; r < size_; ++r) {
      if (fds_[static_cast<size_t>(r)].valid() && state(r) == State::kAlive) {
        fds.push_back({fds_[static_cast<size_t>(r)].get(), POLLIN, 0});
        ranks.push_back(r);
      }
    }
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const size_t r = static_cast<size_t>(ranks[i]);
      char buf[64];
      const ssize_t k = ::recv(fds[i].fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        if (std::memchr(buf, kGoodbye, static_cast<size_t>(k)) != nullptr) said_goodbye[r] = true;
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      states_[r] = said_goodbye[r] ? State::kLeft : State::kDied;
    }
  }
}

int Liveness::first_died() const {
  for (int r = 0; r < size_; ++r) {
    if (state(r) == State::kDied) return r;
  }
  return -1;
}

std::string Liveness::describe(int peer, State state) {
  const std::string who = "rank " + std::to_string(peer);
  if (state == State::kLeft) {
    return who + " left: it said goodbye (closed its communicator) and closed its connections";
  }
  return who + "'s process ended (killed, crashed, or exited without closing its communicator)";
}

}  // namespace rr
