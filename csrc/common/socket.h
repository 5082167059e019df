// Small POSIX socket helpers shared by the TCP transport and the TCP store.
// Blocking-style helpers here still honour a Deadline: they run on
// non-blocking sockets and poll() in bounded slices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace rr {

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Listens on `host` (empty = all interfaces) and `port` (0 = any free port). A fixed
// port that is in use is tried again every 20 ms for up to `busy_seconds`.
Fd listen_tcp(const std::string& host, int port, int backlog = 128, double busy_seconds = 0);
int bound_port(int fd);
// The local IP address of a connected socket, as text.
std::string local_ip(int fd);

// Connects to host:port, retrying refused/unreachable attempts until the
// deadline (the peer may not be listening yet). Throws TimeoutError naming
// `what` when the deadline passes.
Fd connect_tcp(const std::string& host, int port, const Deadline& deadline,
               const std::string& what);

// Accepts one connection, waiting at most until the deadline.
// `peer`: the rank blamed when nobody connects in time (-1: none).
Fd accept_tcp(int listen_fd, const Deadline& deadline, const std::string& what, int peer = -1);

void set_nonblocking(int fd);
// TCP_NODELAY: small messages go out at once, not after the previous one's ACK.
void set_no_delay(int fd);
// TCP_NODELAY and large kernel buffers: the ring streams megabytes per step.
void tune_stream_socket(int fd);
// TCP keepalive: once the connection has been idle for a second, a probe every
// second, and the socket fails with ETIMEDOUT when the peer's machine has answered
// none for about `seconds` (a network partition, a frozen or powered-off host).
// Probes go out only while nothing we sent is unacknowledged, and a live peer's
// kernel answers them even while its process is stopped or busy, so a slow rank is
// never taken for a dead one. 0: off.
void set_keepalive(int fd, int seconds);
// set_keepalive, and bytes we sent that stay unacknowledged for `seconds` fail
// the socket too (TCP_USER_TIMEOUT): a request to a machine gone off the network
// fails then, not after minutes of retransmissions. Only for a peer that always
// reads at once (a store's server): since Linux 5.11 it also ends a connection
// whose receiver merely stopped reading. 0: off.
void set_request_keepalive(int fd, int seconds);
// True when a connection's error means the peer's machine answered nothing:
// ETIMEDOUT (keepalive probes or retransmissions unanswered), or the soft
// error the kernel reports instead when it also found no route or neighbour
// to the machine meanwhile (EHOSTUNREACH, ENETUNREACH).
bool unreachable_errno(int err);

// Sends/receives exactly n bytes before the deadline. Throws PeerError(peer) when
// the connection breaks and TimeoutError(peer) at the deadline.
void send_exact(int fd, const void* data, size_t n, const Deadline& deadline, int peer,
                const std::string& what);
void recv_exact(int fd, void* data, size_t n, const Deadline& deadline, int peer,
                const std::string& what);

}  // namespace rr
