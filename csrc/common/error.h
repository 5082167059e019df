// Typed errors. Every failure the engine can observe becomes one of these; the
// library never calls exit() or abort(). The bindings map each class onto the
// Python exception of the same name in ringreduce.errors.
#pragma once

#include <stdexcept>
#include <string>

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
class PeerError : public Error {
 public:
  PeerError(const std::string& what, int peer) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Ranks disagreed on which collective to run or on its arguments.
class MismatchError : public Error {
 public:
  MismatchError(const std::string& what, int peer) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
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
