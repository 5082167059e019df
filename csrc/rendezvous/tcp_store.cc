// The TCP store: a tiny request/response protocol on one connection per rank.
//
//   request  = u8 command, u32 key length, key, u32 value length, value
//   response = u8 status (0 = ok, 1 = missing), u32 value length, value
//   notice   = u8 status 2, u32 length, key '\0' value
//
// The server is a thread on the hosting rank that polls its listening socket
// and every client; requests are small, so replies are written synchronously.
//
// When set_if_absent stores a key for the first time, the server also pushes
// a notice of it to every other client. set_if_absent keys are final, so a
// client may answer from the notices it holds; and because a notice lands in
// the client's socket buffer at once, it survives the server: when the
// hosting rank fails, publishes why and exits, the others still read its
// report after the server is gone.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/socket.h"
#include "rendezvous/store.h"

namespace rr {
namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kSetIfAbsent = 3 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kNotice = 2 };
// How long the server waits for a client to take a reply.
constexpr double kServerIoSeconds = 30.0;

void append_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }

class StoreServer {
 public:
  explicit StoreServer(Fd listener) : listener_(std::move(listener)) {
    thread_ = std::thread([this] { run(); });
  }
  ~StoreServer() {
    stop_ = true;
    thread_.join();
  }

 private:
  struct Client {
    Fd fd;
    std::string inbox;
  };

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds;
      fds.push_back({listener_.get(), POLLIN, 0});
      for (auto& c : clients_) fds.push_back({c.fd.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      if (fds[0].revents & POLLIN) accept_all();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents) serve(clients_[i - 1]);
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
      set_nonblocking(fd);
      clients_.push_back(Client{Fd(fd), {}});
    }
  }

  void serve(Client& c) {
    char buf[4096];
    while (true) {
      ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        c.inbox.append(buf, static_cast<size_t>(k));
        continue;
      }
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.fd.reset();  // the client left; its keys stay
        return;
      }
      break;
    }
    try {
      while (handle_one(c)) {
      }
    } catch (const Error&) {
      c.fd.reset();  // a client that stops reading replies is dropped, not waited on
    }
  }

  // Parses and answers one complete request from the client's inbox.
  bool handle_one(Client& c) {
    const std::string& in = c.inbox;
    if (in.size() < 5) return false;
    uint32_t klen, vlen;
    std::memcpy(&klen, in.data() + 1, 4);
    if (in.size() < 9 + klen) return false;
    std::memcpy(&vlen, in.data() + 5 + klen, 4);
    size_t total = 9 + size_t{klen} + vlen;
    if (in.size() < total) return false;
    uint8_t cmd = static_cast<uint8_t>(in[0]);
    std::string key = in.substr(5, klen);
    std::string value = in.substr(9 + klen, vlen);
    c.inbox.erase(0, total);

    uint8_t status = 0;
    std::string reply;
    if (cmd == kSet) {
      data_[key] = value;
    } else if (cmd == kGet) {
      auto it = data_.find(key);
      if (it == data_.end()) {
        status = 1;
      } else {
        reply = it->second;
      }
    } else if (cmd == kSetIfAbsent) {
      auto [it, inserted] = data_.emplace(key, value);
      reply = it->second;
      if (inserted) notify_others(c, key, value);
    } else {
      c.fd.reset();
      return false;
    }
    send_message(c, status, reply);
    return true;
  }

  void send_message(Client& c, uint8_t status, const std::string& body) {
    std::string out(1, static_cast<char>(status));
    append_u32(out, static_cast<uint32_t>(body.size()));
    out += body;
    send_exact(c.fd.get(), out.data(), out.size(), Deadline::after(kServerIoSeconds), -1,
               "store client");
  }

  void notify_others(const Client& from, const std::string& key, const std::string& value) {
    const std::string body = key + '\0' + value;
    for (auto& other : clients_) {
      if (&other == &from || !other.fd.valid()) continue;
      try {
        send_message(other, kNotice, body);
      } catch (const Error&) {
        other.fd.reset();
      }
    }
  }

  Fd listener_;
  std::vector<Client> clients_;
  std::map<std::string, std::string> data_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  TcpStore(std::unique_ptr<StoreServer> server, Fd fd, double io_seconds)
      : server_(std::move(server)), fd_(std::move(fd)), io_seconds_(io_seconds) {}

  void set(const std::string& key, const std::string& value) override { request(kSet, key, value); }
  std::optional<std::string> try_get(const std::string& key) override {
    std::string value;
    if (auto known = noticed(key)) return known;
    if (request(kGet, key, "", &value) != kOk) return noticed(key);
    return value;
  }
  bool hosted_here() const override { return server_ != nullptr; }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    if (auto known = noticed(key)) return *known;
    std::string stored;
    try {
      request(kSetIfAbsent, key, value, &stored);
    } catch (const Error&) {
      // The server may be gone; a notice it sent before going may not be.
      if (auto known = noticed(key)) return *known;
      throw;
    }
    return stored;
  }

 private:
  static constexpr const char* kWhat = "the rendezvous store (rank 0)";

  uint8_t request(uint8_t cmd, const std::string& key, const std::string& value,
                  std::string* reply = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    const Deadline deadline = Deadline::after(io_seconds_);
    std::string msg(1, static_cast<char>(cmd));
    append_u32(msg, static_cast<uint32_t>(key.size()));
    msg += key;
    append_u32(msg, static_cast<uint32_t>(value.size()));
    msg += value;
    send_exact(fd_.get(), msg.data(), msg.size(), deadline, 0, kWhat);
    while (true) {
      std::string body;
      uint8_t status = read_message(deadline, &body);
      if (status != kNotice) {
        if (reply) *reply = std::move(body);
        return status;
      }
      keep_notice(body);
    }
  }

  uint8_t read_message(const Deadline& deadline, std::string* body) {
    char head[5];
    recv_exact(fd_.get(), head, 5, deadline, 0, kWhat);
    uint32_t len;
    std::memcpy(&len, head + 1, 4);
    body->assign(len, '\0');
    recv_exact(fd_.get(), body->data(), len, deadline, 0, kWhat);
    return static_cast<uint8_t>(head[0]);
  }

  void keep_notice(const std::string& body) {
    const size_t split = body.find('\0');
    if (split != std::string::npos) notices_[body.substr(0, split)] = body.substr(split + 1);
  }

  // The value of `key` if a notice of it has arrived, reading any notices
  // waiting in the socket (even after the server has closed it) first.
  std::optional<std::string> noticed(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    pollfd p{fd_.get(), POLLIN, 0};
    while (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
      std::string body;
      try {
        // Whole messages only: the server writes each one in a single send.
        if (read_message(Deadline::after(0.1), &body) != kNotice) break;
      } catch (const Error&) {
        break;  // the server closed the connection; notices before that are kept
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
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      const Deadline& deadline, double io_seconds) {
  std::unique_ptr<StoreServer> server;
  if (is_server) {
    // Listen on every interface: MASTER_ADDR names this host as the others see it.
    try {
      server = std::make_unique<StoreServer>(listen_tcp("", port));
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + ": rank 0 hosts ringreduce's rendezvous store on port " +
                  std::to_string(port) +
                  " and another program holds it (torch.distributed's env:// store, if the job "
                  "uses both?); set RINGREDUCE_PORT to a free port on every rank");
    }
  }
  Fd fd = connect_tcp(host, port, deadline,
                      "rank 0's rendezvous store (is rank 0 running, with the same "
                      "MASTER_ADDR, MASTER_PORT and RINGREDUCE_PORT?)");
  return std::make_unique<TcpStore>(std::move(server), std::move(fd), io_seconds);
}

}  // namespace rr
