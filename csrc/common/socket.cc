#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "common/error.h"

namespace rr {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool unreachable_errno(int err) {
  return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
}

// A connection that failed so had data or keepalive probes go unanswered by
// the peer's machine (its kernel acknowledges them even while the process is
// stopped): the machine is unreachable.
static std::string lost_reason(int err) { return unreachable_errno(err) ? kUnreachable : ""; }

static addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    throw Error("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return res;
}

Fd listen_tcp(const std::string& host, int port, int backlog, double busy_seconds) {
  addrinfo* res = resolve(host, port, true);
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(busy_seconds));
  for (;;) {
    Fd fd(::socket(res->ai_family, res->ai_socktype, res->ai_protocol));
    if (!fd.valid()) {
      ::freeaddrinfo(res);
      throw Error(errno_message("socket()", errno));
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) {
      int err = errno;
      // A port held for a moment (a previous job's store still closing, another
      // program probing for a free port) is waited for, up to busy_seconds.
      if (err == EADDRINUSE && port != 0 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      ::freeaddrinfo(res);
      throw Error(errno_message(
          "cannot bind " + (host.empty() ? std::string("*") : host) + ":" + std::to_string(port),
          err));
    }
    ::freeaddrinfo(res);
    if (::listen(fd.get(), backlog) != 0) throw Error(errno_message("listen()", errno));
    set_nonblocking(fd.get());
    return fd;
  }
}

int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

std::string local_ip(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof buf);
  return buf;
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void tune_stream_socket(int fd) {
  set_no_delay(fd);
  int bytes = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

void set_keepalive(int fd, int seconds) {
  if (seconds <= 0) return;
  int on = 1;
  int idle = 1;
  int interval = 1;
  // The kernel takes 1..127 probes.
  int probes = std::clamp(seconds - idle, 1, 127);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

void set_request_keepalive(int fd, int seconds) {
  if (seconds <= 0) return;
  set_keepalive(fd, seconds);
  unsigned int ms = static_cast<unsigned int>(seconds) * 1000u;
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
}

// Waits for `events` on fd for at most the time left (and at most 100 ms, so
// the caller re-checks its deadline regularly).
static int poll_one(int fd, short events, const Deadline& deadline) {
  pollfd p{fd, events, 0};
  int rc = ::poll(&p, 1, deadline.poll_ms(100));
  return rc > 0 ? p.revents : 0;
}

Fd connect_tcp(const std::string& host, int port, const Deadline& deadline,
               const std::string& what) {
  std::string last_error = "no attempt made";
  int backoff_ms = 10;
  while (true) {
    addrinfo* res = resolve(host, port, false);
    Fd fd(::socket(res->ai_family, res->ai_socktype, res->ai_protocol));
    set_nonblocking(fd.get());
    int rc = ::connect(fd.get(), res->ai_addr, res->ai_addrlen);
    ::freeaddrinfo(res);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      while (!deadline.expired()) {
        int revents = poll_one(fd.get(), POLLOUT, deadline);
        if (revents) {
          socklen_t len = sizeof err;
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          break;
        }
      }
      if (err == EINPROGRESS) err = ETIMEDOUT;
    }
    if (err == 0) {
      tune_stream_socket(fd.get());
      return fd;
    }
    last_error = errno_message("connect", err);
    if (deadline.expired()) {
      throw TimeoutError("timed out after " + format_seconds(deadline.seconds()) +
                             " s connecting to " + what + " at " + host + ":" +
                             std::to_string(port) + " (" + last_error + ")",
                         -1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.poll_ms(backoff_ms)));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

Fd accept_tcp(int listen_fd, const Deadline& deadline, const std::string& what, int peer) {
  while (true) {
    int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd >= 0) {
      set_nonblocking(fd);
      tune_stream_socket(fd);
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw Error(errno_message("accept() for " + what, errno));
    }
    if (deadline.expired()) {
      throw TimeoutError("timed out after " + format_seconds(deadline.seconds()) +
                             " s waiting for " + what + " to connect",
                         peer);
    }
    poll_one(listen_fd, POLLIN, deadline);
  }
}

void send_exact(int fd, const void* data, size_t n, const Deadline& deadline, int peer,
                const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw PeerError(errno_message("lost connection to " + what, errno), peer, lost_reason(errno));
    }
    if (deadline.expired()) {
      throw TimeoutError(
          "timed out after " + format_seconds(deadline.seconds()) + " s sending to " + what, peer);
    }
    poll_one(fd, POLLOUT, deadline);
  }
}

void recv_exact(int fd, void* data, size_t n, const Deadline& deadline, int peer,
                const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) throw PeerError(what + " closed the connection", peer);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw PeerError(errno_message("lost connection to " + what, errno), peer, lost_reason(errno));
    }
    if (deadline.expired()) {
      throw TimeoutError(
          "timed out after " + format_seconds(deadline.seconds()) + " s waiting for " + what, peer);
    }
    poll_one(fd, POLLIN, deadline);
  }
}

}  // namespace rr
