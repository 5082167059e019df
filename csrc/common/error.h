// Typed errors. Every failure the engine can observe becomes one of these; the
// library never calls exit() or abort(). The bindings map each class onto the
// Python exception of the same name in ringreduce.errors.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace rr {

// Base class: ringreduce.RingReduceError.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A deadline passed while waiting on `peer` (-1 when no single peer is to blame).
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, int peer) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// A peer died, closed its connection or reported a failure of its own.
// `reason` says what is known of the peer beyond the message, for callers to
// act on without parsing it: "unreachable" when its machine answered nothing
// (TCP keepalive probes or a request's retransmissions went unacknowledged:
// a network partition, a frozen or powered-off host, never a slow process),
// "" when nothing more is known.
//
// A transport says what it learned of the peer ("rank 2 exited, crashed or
// was killed"); the waiter (transport/waiter.h) then says, once, what this
// rank was waiting for when it learned it, and marks the error `framed` so
// that a wait inside another wait (a routed transport's part) does not say
// it twice.
class PeerError : public Error {
 public:
  PeerError(const std::string& what, int peer, std::string reason = {}, bool framed = false)
      : Error(what), peer_(peer), reason_(std::move(reason)), framed_(framed) {}
  int peer() const { return peer_; }
  const std::string& reason() const { return reason_; }
  bool framed() const { return framed_; }

 private:
  int peer_;
  std::string reason_;
  bool framed_;
};

// PeerError's reasons (see above).
inline constexpr const char* kUnreachable = "unreachable";

// The facts of a disagreement between two ranks, so that callers act on them
// (the Python layer names the issuing threads) without parsing the message.
// Index 0 is the rank whose side was received, index 1 the rank that found
// the disagreement.
struct MismatchFacts {
  // "call": different collectives or arguments; "thread": the same call
  // number issued by differently named threads; "segments": different
  // RINGREDUCE_SEGMENT_BYTES; "blocks": all_to_all block sizes; "message": a
  // point-to-point message of another size than the receive's.
  std::string reason;
  int ranks[2] = {-1, -1};
  std::string calls[2];          // each side as the user wrote it ("" when not known)
  uint64_t issuers[2] = {0, 0};  // each side's issuing-thread tag (0: not told)
  bool known() const { return !reason.empty(); }
};

// Ranks disagreed on which collective to run or on its arguments.
class MismatchError : public Error {
 public:
  MismatchError(const std::string& what, int peer, MismatchFacts facts = {})
      : Error(what), peer_(peer), facts_(std::move(facts)) {}
  int peer() const { return peer_; }
  const MismatchFacts& facts() const { return facts_; }

 private:
  int peer_;
  MismatchFacts facts_;
};

// A wait abandoned because the caller asked (Ctrl-C in Python): the bindings
// raise the caller's own exception (KeyboardInterrupt) in its place.
class Interrupted : public Error {
 public:
  explicit Interrupted(const std::string& what) : Error(what) {}
};

// Bad arguments detected locally, before any communication (Python ValueError).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

// A process without the job's token (or with another one) tried to join, or a
// peer failed to prove it knows the token (Python AuthenticationError).
class AuthenticationError : public Error {
 public:
  explicit AuthenticationError(const std::string& what) : Error(what) {}
};

// Formats errno into "what: strerror".
std::string errno_message(const std::string& what, int err);

}  // namespace rr
