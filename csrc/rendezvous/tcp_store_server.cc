// The TCP store's server (tcp_store_server.h): a thread on the hosting rank that polls
// its listening socket and every client; requests are small, so replies are written
// synchronously. A client first proves it holds the job's token (when one is set);
// until it has, nothing it sends is read as a request. A malformed or oversized frame,
// a wrong proof or a silent unauthenticated client closes that one connection, with
// one line on stderr, and the store goes on serving.
//
// When set_if_absent stores a key for the first time, the server also pushes a notice
// of it to every other client (the client side: tcp_store.cc).
#include "rendezvous/tcp_store_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/socket.h"
#include "rendezvous/store_protocol.h"

namespace rr {
namespace {

// How long the server waits for a client to take a reply.
constexpr double kServerIoSeconds = 30.0;
// How long a connection may take to prove the token before it is dropped.
constexpr double kHandshakeSeconds = 10.0;
// More simultaneous connections than any job needs: the rest are refused.
constexpr size_t kMaxClients = 16384;

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  return std::string(text) + ":" + std::to_string(port);
}

}  // namespace

class StoreServer::Loop {
 public:
  Loop(Fd listener, std::string token)
      : listener_(std::move(listener)),
        token_(std::move(token)),
        port_(bound_port(listener_.get())),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!wake_.valid()) throw Error(errno_message("eventfd()", errno));
    thread_ = std::thread([this] { run(); });
  }
  // Wakes the server thread at once (it would otherwise notice stop_ only at its
  // next 100 ms poll timeout, a wait paid by every communicator that closes).
  ~Loop() {
    stop_ = true;
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    thread_.join();
  }
  // The server thread closes the listening socket on its next round.
  void stop_accepting() { sealed_ = true; }
  int port() const { return port_; }

  // Drops every key that starts with `prefix`: keys no reader needs any more
  // (an agreement's check-ins and decision once later rounds are decided), so
  // that a store which outlives many rounds does not grow with them. The
  // number of keys dropped. Safe from any thread.
  size_t erase_prefix(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(data_mu_);
    size_t dropped = 0;
    auto it = data_.lower_bound(prefix);
    while (it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0) {
      it = data_.erase(it);
      ++dropped;
    }
    return dropped;
  }
  // How many keys the store holds now.
  size_t key_count() {
    std::lock_guard<std::mutex> lock(data_mu_);
    return data_.size();
  }

 private:
  struct Client {
    Fd fd;
    std::string inbox;
    bool welcomed = false;  // proved the token (or none is needed)
    Nonce nonce{};          // our half of its handshake
    Deadline handshake = Deadline::after(kHandshakeSeconds);
    std::string address;
    // A wait (kStoreWait) held until its key is set or wait_until: the client
    // sends nothing else meanwhile, and whatever it does send waits too.
    std::optional<std::string> waiting;
    std::chrono::steady_clock::time_point wait_until;
  };

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds;
      if (sealed_ && listener_.valid()) listener_.reset();
      fds.push_back({listener_.get(), POLLIN, 0});  // fd -1 once sealed: poll skips it
      for (auto& c : clients_) fds.push_back({c.fd.get(), POLLIN, 0});
      fds.push_back({wake_.get(), POLLIN, 0});  // last: the destructor's wake-up
      if (::poll(fds.data(), fds.size(), poll_ms()) > 0) {
        if (fds[0].revents & POLLIN) accept_all();
        for (size_t i = 1; i + 1 < fds.size(); ++i) {
          if (fds[i].revents) serve(clients_[i - 1]);
        }
      }
      end_waits();
      while (resumed_) {  // clients answered by another's set: what they sent since
        resumed_ = false;
        for (auto& c : clients_) {
          if (c.fd.valid() && c.welcomed && !c.waiting && !c.inbox.empty()) answer(c);
        }
      }
      for (auto& c : clients_) {
        if (c.fd.valid() && !c.welcomed && c.handshake.expired()) drop(c, "no handshake in time");
      }
      clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                    [](const Client& c) { return !c.fd.valid(); }),
                     clients_.end());
    }
  }

  void accept_all() {
    while (true) {
      int fd = ::accept(listener_.get(), nullptr, nullptr);
      if (fd < 0) return;
      Fd owned(fd);
      if (clients_.size() >= kMaxClients) continue;  // closed at once
      set_nonblocking(fd);
      set_no_delay(fd);
      Client c;
      c.fd = std::move(owned);
      c.address = peer_address(fd);
      c.nonce = random_nonce();
      const std::string greeting = encode_greeting({!token_.empty(), c.nonce});
      // A fresh socket's buffer takes the few bytes at once.
      if (::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(greeting.size())) {
        continue;
      }
      clients_.push_back(std::move(c));
    }
  }

  // Closes one client's connection and says why, once.
  void drop(Client& c, const std::string& why) {
    std::fprintf(stderr,
                 "ringreduce: rendezvous store on port %d closed the connection from %s: %s\n",
                 port_, c.address.c_str(), why.c_str());
    c.fd.reset();
  }

  void serve(Client& c) {
    char buf[4096];
    while (true) {
      ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        c.inbox.append(buf, static_cast<size_t>(k));
        // No request is longer than this: a client sending more is not one of ours.
        if (c.inbox.size() > kStoreMaxRequest + kStoreAnswerBytes) {
          drop(c, "sent more than the largest request");
          return;
        }
        continue;
      }
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.fd.reset();  // the client left; its keys stay
        return;
      }
      break;
    }
    if (!c.welcomed) {
      try {
        if (!handshake(c)) return;
      } catch (const Error&) {
        c.fd.reset();
        return;
      }
    }
    answer(c);
  }

  // Answers the requests complete in the client's inbox, up to one it must wait on.
  void answer(Client& c) {
    try {
      while (c.fd.valid() && !c.waiting && handle_one(c)) {
      }
    } catch (const Error&) {
      c.fd.reset();  // a client that stops reading replies is dropped, not waited on
    }
  }

  // How long the next poll may sleep: until the first held wait runs out (100 ms
  // at most, for stop_ and the handshakes' deadlines).
  int poll_ms() const {
    const auto now = std::chrono::steady_clock::now();
    auto first = now + std::chrono::milliseconds(100);
    for (const auto& c : clients_) {
      if (c.waiting && c.wait_until < first) first = c.wait_until;
    }
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(first - now).count();
    return static_cast<int>(std::max<int64_t>(0, ms));
  }

  // Answers the waits whose time ran out (missing), then what their clients sent since.
  void end_waits() {
    const auto now = std::chrono::steady_clock::now();
    for (auto& c : clients_) {
      if (!c.fd.valid() || !c.waiting || c.wait_until > now) continue;
      c.waiting.reset();
      try {
        send_message(c, kStoreMissing, "");
      } catch (const Error&) {
        c.fd.reset();
        continue;
      }
      answer(c);
    }
  }

  // `key` was just set: the clients waiting for it get its value now.
  void settle_waits(const std::string& key, const std::string& value) {
    for (auto& other : clients_) {
      if (!other.fd.valid() || other.waiting != key) continue;
      other.waiting.reset();
      try {
        send_message(other, kStoreOk, value);
      } catch (const Error&) {
        other.fd.reset();
        continue;
      }
      resumed_ = true;
    }
  }

  // Checks the client's proof of the token once its answer is in.
  bool handshake(Client& c) {
    if (c.inbox.size() < kStoreAnswerBytes) return false;
    const std::string_view answer(c.inbox.data(), kStoreAnswerBytes);
    const std::string_view client_nonce = answer.substr(0, 16);
    Digest claimed;
    std::memcpy(claimed.data(), answer.data() + 16, claimed.size());
    const bool ok =
        token_.empty() ||
        digests_equal(claimed, prove(token_, "rr-store-client", {bytes_of(c.nonce), client_nonce}));
    const Digest ours = prove(token_, "rr-store-server", {bytes_of(c.nonce), client_nonce});
    std::string verdict(1, ok ? 0 : 1);
    if (ok) {
      verdict.append(reinterpret_cast<const char*>(ours.data()), ours.size());
      verdict += encode_process(me_);
    } else {
      verdict.append(kStoreVerdictBytes - 1, '\0');
    }
    c.inbox.erase(0, kStoreAnswerBytes);
    send_exact(c.fd.get(), verdict.data(), verdict.size(), Deadline::after(1.0), -1,
               "store client");
    if (!ok) {
      drop(c, "it did not prove the job's token (RINGREDUCE_TOKEN)");
      return false;
    }
    c.welcomed = true;
    return true;
  }

  // Parses and answers one complete request from the client's inbox.
  bool handle_one(Client& c) {
    StoreRequest req;
    size_t consumed = 0;
    std::string error;
    const Parse parsed = parse_store_request(c.inbox, &req, &consumed, &error);
    if (parsed == Parse::kNeedMore) return false;
    if (parsed == Parse::kMalformed) {
      drop(c, "malformed request: " + error);
      return false;
    }
    c.inbox.erase(0, consumed);

    uint8_t status = kStoreOk;
    std::string reply;
    // data_ is this thread's but for erase_prefix() and key_count() from others.
    std::unique_lock<std::mutex> lock(data_mu_);
    if (req.command == kStoreSet) {
      data_[req.key] = req.value;
      lock.unlock();
      settle_waits(req.key, req.value);
    } else if (req.command == kStoreGet || req.command == kStoreWait) {
      auto it = data_.find(req.key);
      if (it != data_.end()) {
        reply = it->second;
      } else if (req.command == kStoreWait && req.wait_ms > 0) {
        c.waiting = req.key;  // answered by settle_waits or end_waits
        c.wait_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(req.wait_ms);
        return false;
      } else {
        status = kStoreMissing;
      }
    } else {
      auto [it, inserted] = data_.emplace(req.key, req.value);
      reply = it->second;
      lock.unlock();
      if (inserted) {
        if (req.command == kStoreSetIfAbsent) notify_others(c, req.key, req.value);
        settle_waits(req.key, req.value);
      }
    }
    send_message(c, status, reply);
    return true;
  }

  void send_message(Client& c, uint8_t status, const std::string& body) {
    const std::string out = encode_store_reply(status, body);
    send_exact(c.fd.get(), out.data(), out.size(), Deadline::after(kServerIoSeconds), -1,
               "store client");
  }

  void notify_others(const Client& from, const std::string& key, const std::string& value) {
    const std::string body = key + '\0' + value;
    for (auto& other : clients_) {
      if (&other == &from || !other.fd.valid() || !other.welcomed) continue;
      try {
        send_message(other, kStoreNotice, body);
      } catch (const Error&) {
        other.fd.reset();
      }
    }
  }

  Fd listener_;
  std::string token_;
  const ProcessName me_ = this_process();  // told to every client that proved the token
  int port_;
  Fd wake_;  // an eventfd: the destructor's word to stop now
  std::vector<Client> clients_;
  std::mutex data_mu_;  // guards data_ against erase_prefix() and key_count()
  std::map<std::string, std::string> data_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sealed_{false};
  bool resumed_ = false;  // a held wait was answered: its client may have sent more
  std::thread thread_;
};

StoreServer::StoreServer(Fd listener, std::string token)
    : loop_(std::make_unique<Loop>(std::move(listener), std::move(token))) {}

StoreServer::~StoreServer() = default;

void StoreServer::stop_accepting() { loop_->stop_accepting(); }

int StoreServer::port() const { return loop_->port(); }

size_t StoreServer::erase_prefix(const std::string& prefix) { return loop_->erase_prefix(prefix); }

size_t StoreServer::key_count() { return loop_->key_count(); }

}  // namespace rr
