// The transport interface: the only thing the algorithms see.
//
// A transport moves byte spans between ranks. It knows nothing of dtypes or
// collectives. Messages between one (sender, receiver) pair are delivered in
// the order they were posted, and receives from one peer are matched in the
// order they were posted, so the algorithms need no tags.
//
// Progress happens inside wait(): the calling thread (the communicator's worker
// thread) drives every outstanding request of this transport, not only the one
// it waits for, so a large send keeps moving while the caller waits for a
// receive. Every wait has a deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/deadline.h"

namespace rr {

// A posted send or receive. It completes inside Transport::wait().
class Request {
 public:
  virtual ~Request() = default;
  virtual bool done() const = 0;
  virtual int peer() const = 0;
};
using RequestPtr = std::shared_ptr<Request>;

struct TransportStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // Posts a send of `bytes` bytes to `peer`. `data` must stay valid until the
  // request completes.
  virtual RequestPtr isend(int peer, const void* data, size_t bytes) = 0;
  // Posts a receive of exactly `bytes` bytes from `peer` into `data`.
  virtual RequestPtr irecv(int peer, void* data, size_t bytes) = 0;

  // Drives progress until `request` completes. Throws TimeoutError when no
  // byte has moved for the deadline's length (so a long transfer on a slow
  // link is not a timeout), and PeerError when the peer's connection fails.
  // After a throw the transport is unusable.
  virtual void wait(Request& request, const Deadline& deadline) = 0;

  // Tears down every connection so that peers blocked on us fail fast instead
  // of waiting for their deadline. Safe to call more than once, and from the
  // error path.
  virtual void abort() noexcept = 0;

  virtual TransportStats stats() const = 0;
};

// Convenience: waits for a send and a receive posted together.
inline void wait_all(Transport& t, Request& a, Request& b, const Deadline& deadline) {
  t.wait(a, deadline);
  t.wait(b, deadline);
}

}  // namespace rr
