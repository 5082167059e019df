// The TCP store: a tiny request/response protocol on one connection per rank
// (the wire format, its limits and its handshake: store_protocol.h).
//
// This file is the client, and make_tcp_store, which starts the server
// (tcp_store_server.h) on the hosting rank.
//
// When set_if_absent stores a key for the first time, the server also pushes
// a notice of it to every other client. set_if_absent keys are final, so a
// client may answer from the notices it holds; and because a notice lands in
// the client's socket buffer at once, it survives the server: when the
// hosting rank fails, publishes why and exits, the others still read its
// report after the server is gone.
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
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store_server.h"

namespace rr {
namespace {

class TcpStore : public Store {
 public:
  TcpStore(std::unique_ptr<StoreServer> server, Fd fd, double io_seconds)
      : server_(std::move(server)), fd_(std::move(fd)), io_seconds_(io_seconds) {}

  void set(const std::string& key, const std::string& value) override {
    request(kStoreSet, key, value);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::string value;
    if (auto known = noticed(key)) return known;
    if (request(kStoreGet, key, "", &value) != kStoreOk) return noticed(key);
    return value;
  }
  void set_many(const std::vector<std::pair<std::string, std::string>>& items) override {
    for (const auto& [key, value] : items) check_limits(key, value.size());  // all or none
    std::string msgs;
    size_t count = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      msgs += encode_store_request(kStoreSet, items[i].first, items[i].second);
      ++count;
      // In batches the socket's buffer holds, as try_get_many's (a large value alone).
      if (msgs.size() >= kBatchBytes || i + 1 == items.size()) {
        exchange(msgs, count, 0, nullptr);
        msgs.clear();
        count = 0;
      }
    }
  }

  // One round trip for many keys: their gets sent together (a batch of requests
  // small enough to sit in the socket's buffer while the server answers, so neither
  // side waits on the other's reading).
  std::vector<std::optional<std::string>> try_get_many(
      const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    size_t i = 0;
    while (i < keys.size()) {
      std::string msgs;
      std::vector<size_t> asked;
      for (; i < keys.size() && (asked.empty() || msgs.size() < kBatchBytes); ++i) {
        if (auto known = noticed(keys[i])) {
          out[i] = std::move(known);
          continue;
        }
        check_limits(keys[i], 0);
        msgs += encode_store_request(kStoreGet, keys[i], "");
        asked.push_back(i);
      }
      if (asked.empty()) continue;
      std::vector<std::string> values;
      const std::vector<uint8_t> statuses = exchange(msgs, asked.size(), 0, &values);
      for (size_t j = 0; j < asked.size(); ++j) {
        const size_t k = asked[j];
        out[k] = statuses[j] == kStoreOk ? std::optional<std::string>(std::move(values[j]))
                                         : noticed(keys[k]);
      }
    }
    return out;
  }
  bool can_wait() const override { return true; }
  // The server holds the request until the key is set or `slice` passes: a
  // waiting rank learns a key the moment it is set, and asks once per slice
  // instead of every millisecond or two.
  std::optional<std::string> wait_get(const std::string& key,
                                      std::chrono::milliseconds slice) override {
    std::string value;
    if (auto known = noticed(key)) return known;
    const auto ms = std::clamp<int64_t>(slice.count(), 0, kStoreMaxWaitMs);
    if (request(kStoreWait, key, std::to_string(ms), &value, ms / 1000.0) != kStoreOk) {
      return noticed(key);
    }
    return value;
  }
  bool hosted_here() const override { return server_ != nullptr; }
  size_t erase_prefix(const std::string& prefix) override {
    return server_ ? server_->erase_prefix(prefix) : Store::erase_prefix(prefix);
  }
  size_t key_count() override { return server_ ? server_->key_count() : Store::key_count(); }
  bool host_lost() const override { return lost_; }
  bool host_unreachable() const override { return unreachable_; }
  bool host_stopped() const override { return stopped_; }
  void set_host_stop_check(bool on) override {
    if (on) stopped_ = false;
    stop_check_ = on;
  }
  void seal() override {
    if (server_) server_->stop_accepting();
  }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    if (auto known = noticed(key)) return *known;
    std::string stored;
    try {
      request(kStoreSetIfAbsent, key, value, &stored);
    } catch (const Error&) {
      // The server may be gone; a notice it sent before going may not be.
      if (auto known = noticed(key)) return *known;
      throw;
    }
    return stored;
  }

  std::string claim(const std::string& key, const std::string& value) override {
    std::string stored;
    request(kStoreClaim, key, value, &stored);
    return stored;
  }

  // Proves we hold `token` (and checks the server does) before any request.
  // The store's first words on a new connection, or nothing when the other end
  // closed it without a greeting (not a store: another program holding the port
  // for a moment, which accepted and let go).
  static std::optional<std::string> read_greeting(int fd, const Deadline& deadline) {
    std::string greeting(kStoreGreetingBytes, '\0');
    try {
      recv_exact(fd, greeting.data(), greeting.size(), deadline, 0, kWhat);
    } catch (const PeerError&) {
      return std::nullopt;
    }
    return greeting;
  }

  void handshake(const std::string& greeting, const std::string& token, const std::string& where,
                 const Deadline& deadline) {
    StoreGreeting g;
    std::string error;
    if (!parse_greeting(greeting, &g, &error)) {
      throw Error("the rendezvous store at " + where + " answered as " + error +
                  ": is another program on that port?");
    }
    if (g.token_required && token.empty()) {
      throw AuthenticationError(
          "the rendezvous store at " + where +
          " requires the job's token and this process has none: set RINGREDUCE_TOKEN (or "
          "init(token=...)) to the job's token on every rank");
    }
    if (!g.token_required && !token.empty()) {
      throw AuthenticationError("this process has a token but the rendezvous store at " + where +
                                " (rank 0) has none: give every rank the same RINGREDUCE_TOKEN");
    }
    const Nonce mine = random_nonce();
    const Digest proof = prove(token, "rr-store-client", {bytes_of(g.nonce), bytes_of(mine)});
    std::string answer(bytes_of(mine));
    answer.append(reinterpret_cast<const char*>(proof.data()), proof.size());
    send_exact(fd_.get(), answer.data(), answer.size(), deadline, 0, kWhat);
    std::string verdict(kStoreVerdictBytes, '\0');
    try {
      recv_exact(fd_.get(), verdict.data(), verdict.size(), deadline, 0, kWhat);
    } catch (const PeerError&) {
      verdict[0] = 1;  // refused: the server may close before we read its verdict
    }
    if (verdict[0] != 0) {
      throw AuthenticationError("the rendezvous store at " + where +
                                " refused this process's token: every rank needs the same "
                                "RINGREDUCE_TOKEN as rank 0");
    }
    Digest theirs;
    std::memcpy(theirs.data(), verdict.data() + 1, theirs.size());
    if (!digests_equal(theirs,
                       prove(token, "rr-store-server", {bytes_of(g.nonce), bytes_of(mine)}))) {
      throw AuthenticationError("the rendezvous store at " + where +
                                " could not prove it knows the job's token: another program "
                                "may be listening on that port");
    }
    host_ = parse_process(std::string_view(verdict).substr(1 + theirs.size()));
  }

 private:
  static constexpr const char* kWhat = "the rendezvous store (rank 0)";

  // `held`: seconds the server may hold the request (a wait) before the I/O
  // timeout starts to count.
  uint8_t request(uint8_t cmd, const std::string& key, const std::string& value,
                  std::string* reply = nullptr, double held = 0) {
    check_limits(key, value.size());
    std::vector<std::string> replies;
    const std::vector<uint8_t> statuses =
        exchange(encode_store_request(cmd, key, value), 1, held, reply ? &replies : nullptr);
    if (reply) *reply = std::move(replies[0]);
    return statuses[0];
  }

  // Requests sent together, at most (plus one): they sit in the socket's buffer
  // while the server answers, so neither side waits on the other's reading.
  static constexpr size_t kBatchBytes = 16 << 10;

  static void check_limits(const std::string& key, size_t value_bytes) {
    if (key.size() > kStoreMaxKey || value_bytes > kStoreMaxValue) {
      throw InvalidArgument("store key '" + key.substr(0, 64) + "' or its value (" +
                            std::to_string(value_bytes) + " bytes) is over the store's limits");
    }
  }

  // Sends `msgs` (`count` requests, encoded back to back) in one write and reads
  // their `count` replies in order (notices between them are kept): one round trip
  // for all. The server answers a connection's requests in the order they came.
  std::vector<uint8_t> exchange(const std::string& msgs, size_t count, double held,
                                std::vector<std::string>* replies) {
    std::lock_guard<std::mutex> lock(mu_);
    if (unanswered_) {
      // A request already went unanswered on this connection: its reply may
      // still come and would be taken for the next one's, and a host that did
      // not answer then (stopped, or starved of CPU for that long) is not to
      // be waited for again by every later request, each for io_seconds (a
      // failure report makes three in a row).
      const std::string why = stopped_ ? " was found stopped (SIGSTOP, Ctrl-Z or a debugger)"
                                       : " did not answer a request within " +
                                             format_seconds(io_seconds_) + " s";
      throw TimeoutError(std::string(kWhat) + why + "; this connection to it is not used again",
                         0);
    }
    const Deadline deadline = Deadline::after(io_seconds_ + held);
    std::vector<uint8_t> statuses;
    try {
      send_exact(fd_.get(), msgs.data(), msgs.size(), deadline, 0, kWhat);
      while (statuses.size() < count) {
        std::string body;
        await_reply(deadline);
        uint8_t status = read_message(deadline, &body);
        if (status == kStoreNotice) {
          keep_notice(body);
          continue;
        }
        statuses.push_back(status);
        if (replies) replies->push_back(std::move(body));
      }
    } catch (const PeerError& e) {
      lost_ = true;  // the server closed our connection: its process is gone
      if (e.reason() == kUnreachable) unreachable_ = true;  // or its machine is
      throw;
    } catch (const TimeoutError&) {
      unanswered_ = true;
      throw;
    }
    return statuses;
  }

  // Waits until the server's next message begins to arrive (or the deadline,
  // which read_message then reports). With the host stop check on (a failure
  // report), a host that this machine sees stopped (SIGSTOP, a debugger) for
  // kStoppedSeconds is not waited for: a stopped process's kernel keeps its
  // connections open, so the wait would last the whole I/O timeout before the
  // report could name anyone. (Not at once: a job stopped and resumed as a
  // whole, Ctrl-Z and fg, may find its host resumed a moment after itself.)
  void await_reply(const Deadline& deadline) {
    constexpr double kStoppedSeconds = 0.2;
    std::optional<Deadline> stopped_until;
    while (true) {
      pollfd p{fd_.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, deadline.poll_ms(50));
      if (ready != 0 || deadline.expired()) return;  // news, an error, or the deadline
      if (!stop_check_ || !process_halted(host_)) {
        stopped_until.reset();
      } else if (!stopped_until) {
        stopped_until = Deadline::after(kStoppedSeconds);
      } else if (stopped_until->expired()) {
        if (process_gone(host_)) {
          // Gone, yet its connection is open: another process holds its sockets
          // (one it forked inherits them) or the network between us was cut.
          throw PeerError(std::string(kWhat) + ", process " + std::to_string(host_.pid) +
                              " on this machine, is gone (exited or killed) though its "
                              "connection is still open (a process it forked may hold it)",
                          0);
        }
        stopped_ = true;
        throw TimeoutError(std::string(kWhat) + ", process " + std::to_string(host_.pid) +
                               " on this machine, is stopped (SIGSTOP, Ctrl-Z or a debugger) "
                               "and did not answer a request",
                           0);
      }
    }
  }

  uint8_t read_message(const Deadline& deadline, std::string* body) {
    char head[5];
    recv_exact(fd_.get(), head, 5, deadline, 0, kWhat);
    uint8_t status = 0;
    size_t consumed = 0;
    std::string error;
    // The head alone tells whether the frame is acceptable before its body is read.
    std::string probe(head, 5);
    if (parse_store_reply(probe, &status, body, &consumed, &error) == Parse::kMalformed) {
      throw Error("the rendezvous store sent a malformed reply (" + error + ")");
    }
    uint32_t len;
    std::memcpy(&len, head + 1, 4);
    body->assign(len, '\0');
    recv_exact(fd_.get(), body->data(), len, deadline, 0, kWhat);
    return static_cast<uint8_t>(head[0]);
  }

  void keep_notice(const std::string& body) {
    std::string key, value;
    if (split_notice(body, &key, &value)) notices_[key] = std::move(value);
  }

  // The value of `key` if a notice of it has arrived, reading any notices
  // waiting in the socket (even after the server has closed it) first.
  std::optional<std::string> noticed(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    pollfd p{fd_.get(), POLLIN, 0};
    // After an unanswered request the stream may stop mid-reply: nothing more
    // is read from it.
    while (!unanswered_ && ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
      std::string body;
      try {
        // Whole messages only: the server writes each one in a single send.
        if (read_message(Deadline::after(0.1), &body) != kStoreNotice) break;
      } catch (const PeerError& e) {
        lost_ = true;  // the server closed the connection; notices before that are kept
        if (e.reason() == kUnreachable) unreachable_ = true;  // or keepalive found it cut off
        break;
      } catch (const Error&) {
        break;
      }
      keep_notice(body);
    }
    auto it = notices_.find(key);
    if (it == notices_.end()) return std::nullopt;
    return it->second;
  }

  // Declared first so it outlives our own client connection on destruction.
  std::unique_ptr<StoreServer> server_;
  Fd fd_;
  double io_seconds_;
  std::mutex mu_;
  std::map<std::string, std::string> notices_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> unreachable_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> stop_check_{false};
  bool unanswered_ = false;  // a request timed out (under mu_)
  ProcessName host_;         // the server's process, as its greeting said
};

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "ip6-localhost") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      const Deadline& deadline, double io_seconds,
                                      const std::string& token,
                                      const std::function<void(int)>& listening,
                                      double busy_port_seconds, int keepalive_seconds) {
  std::unique_ptr<StoreServer> server;
  if (is_server) {
    // MASTER_ADDR names this host as the others see it: listen on every
    // interface, unless it is a loopback address (a job on one host), where
    // nothing off this host should reach the store.
    const std::string bind = is_loopback(host) ? "127.0.0.1" : "";
    try {
      // A port still held by the previous job on it (a restart on the same
      // MASTER_PORT), or by a moment's probe elsewhere, is waited for briefly: a
      // program that keeps it gets the error below within busy_port_seconds.
      server = std::make_unique<StoreServer>(
          listen_tcp(bind, port, 128, std::min(busy_port_seconds, deadline.seconds())), token);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + ": rank 0 hosts ringreduce's rendezvous store on port " +
                  std::to_string(port) +
                  " and another program holds it (torch.distributed's env:// store, if the job "
                  "uses both?); set RINGREDUCE_PORT to a free port on every rank");
    }
    // Port 0: the kernel chose one; the others learn it from whoever started them.
    port = server->port();
    if (listening) listening(port);
  } else if (port <= 0) {
    throw InvalidArgument(
        "master_port must be a port in [1, 65535] on every rank but rank 0 "
        "(which may pass 0 to listen on any free port), got " +
        std::to_string(port));
  }
  // A program that holds the port for a moment (a probe; the previous job's store,
  // closing) may accept the connection and close it without a word: that is not the
  // store, so connect again, until the store greets us or the deadline passes.
  Fd fd;
  std::optional<std::string> greeting;
  while (!greeting) {
    fd = connect_tcp(host, port, deadline,
                     "rank 0's rendezvous store (is rank 0 running, with the same "
                     "MASTER_ADDR, MASTER_PORT and RINGREDUCE_PORT?)");
    // Requests and replies are a few small writes each: without this, Nagle holds the
    // second write back until the first is acknowledged, and the peer delays that
    // acknowledgement by up to 40 ms, a delay per store round trip.
    set_no_delay(fd.get());
    set_request_keepalive(fd.get(), keepalive_seconds);
    greeting = TcpStore::read_greeting(fd.get(), deadline);
    if (!greeting) {
      if (deadline.expired()) {
        throw TimeoutError("the program on " + host + ":" + std::to_string(port) +
                               " closed every connection without greeting as rank 0's "
                               "rendezvous store does: another program holds that port? "
                               "(RINGREDUCE_PORT or MASTER_PORT chooses another)",
                           0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  auto store = std::make_unique<TcpStore>(std::move(server), std::move(fd), io_seconds);
  store->handshake(*greeting, token, host + ":" + std::to_string(port), deadline);
  return store;
}

}  // namespace rr
