// The engine's one way to wait for a request on a transport: spinning,
// sleeping, renewing the deadline, looking at the awaited peer's liveness,
// and choosing whom to blame all happen here, once, for every transport that
// waits through it. A transport supplies small primitives (Waitable).
//
// Progress means that something moved on the link of the awaited request: a
// message or bytes to or from its peer, as the transport counts them
// (Waitable::moved). Each movement restarts the deadline's window, so the
// deadline bounds time without progress, not the whole transfer: a large
// message on a slow link may take longer than the timeout, a stalled peer may
// not. Traffic on other links does not count, so that in a stalled ring the
// rank that waits on the stalled peer is the first to time out and can name
// it (engine/failure_report.h then follows the chain of waits to its end).
//
// Blame goes to the awaited request's peer: PeerError as soon as the
// transport learns that the peer is gone (it exited, was killed, closed its
// communicator or gave up on it; check_peer, or an error from progress), and
// TimeoutError when it merely made no progress for a whole window
// (timed_out). Whatever the peer published before it went is taken first:
// a request it completed still completes. Another rank is blamed only where
// the transport has proof that it is gone (its connection ended, a liveness
// signal), never for a mere silence.
//
// Both errors are worded here, once, for every transport: the transport says
// what it learned ("rank 2 exited, crashed or was killed"), and the waiter
// adds what this rank was waiting for then (Waitable::context: "while rank 0
// was receiving 4096 bytes from rank 2 over tcp"); a timeout says how long
// nothing moved, which way, how many bytes, with whom, over what.
//
// How: rounds of progress() and a pause() (a CPU pause, or a yield when the
// host has more ranks than cores) for up to `spin` (a neighbour's message is
// usually microseconds away), looking at the clock, the deadline and, less
// often, the peer's liveness only every few rounds; then sleeps in the
// transport's blocking primitive (block: a futex, poll()) of at most
// `max_sleep`, looking at the peer after each. The interrupt a Deadline
// carries (Ctrl-C) is asked whenever the deadline is.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace rr {

// What a wait is, for the errors it raises: this rank, what it waits for
// (Request::what(): "receiving 4096 bytes from rank 1") and the transport's
// name(). A rank of -1: nothing to add (the wait words its own errors).
struct WaitContext {
  int rank = -1;
  std::string doing;
  std::string transport;
};

// One awaited request, as its transport lets the waiter drive it.
class Waitable {
 public:
  virtual ~Waitable() = default;
  virtual bool done() const = 0;
  // Taken before each progress(): block() returns at once if an event came
  // after it was taken (a futex word's value), so that none is slept through.
  virtual uint32_t arm() { return 0; }
  // Moves whatever can move now, on every link (not only the awaited one:
  // a peer may be waiting on us too). May throw PeerError.
  virtual void progress() = 0;
  // What has moved on the awaited link so far (monotonic).
  virtual uint64_t moved() const = 0;
  // Throws PeerError if the awaited peer is known to be gone, after taking
  // what it published before it went (which may complete the request).
  virtual void check_peer() {}
  // One round of waiting without sleeping.
  virtual void pause() = 0;
  // Sleeps until an event since `armed`, or `bound` at most.
  virtual void block(uint32_t armed, std::chrono::microseconds bound) = 0;
  // No progress for a whole `window`: throws TimeoutError naming the awaited
  // peer, or returns when a last exchange with it completed the request.
  virtual void timed_out(const Deadline& window) = 0;
  // For wait_slice: another thread asked the transport to let its waits
  // return (Transport::wake) since this wait began.
  virtual bool woken() const { return false; }
  // What this wait is, for a PeerError raised while it runs.
  virtual WaitContext context() const { return {}; }
};

// A sleeping wait wakes this often to look whether its peer is alive (a rank that
// dies rings no doorbell): 100 wake-ups a second cost a sleeping rank next to
// nothing, and a survivor notices a death within about this much.
constexpr std::chrono::microseconds kLivenessSlice{10000};

struct WaitPolicy {
  // Spinning before the first sleep. A transport with nothing to sleep on
  // (MPI) spins for ever, and its pause() backs off by itself.
  std::chrono::microseconds spin{0};
  unsigned rounds_per_look = 1;     // while spinning: the clock every this many rounds
  unsigned looks_per_check = 1024;  // while spinning: the peer every this many looks
  // The longest sleep: also how often a sleeping wait looks whether the awaited
  // peer is still alive, which bounds how late it notices a dead one.
  std::chrono::microseconds max_sleep{kLivenessSlice};
};

// Returns once the request is done; throws as described above.
void wait_until_done(Waitable& w, const Deadline& deadline, const WaitPolicy& policy);

// The same loop for one slice (Transport::wait_for), for a thread that serves
// several requests or transports: it returns whether the request is done once
// `slice` ends or another thread woke the transport (Waitable::woken), and it
// never times out, as its caller keeps the deadline. Progress and the peer's
// liveness are as above, so a peer that is gone still raises.
bool wait_slice(Waitable& w, std::chrono::microseconds slice, const WaitPolicy& policy);

// The one text of a wait that saw no progress for a whole window, raised by
// every transport's timed_out(): how long, what waited (`doing`: which way,
// how many bytes, with whom: Request::what()), over which transport (its
// name(), worded: "over shared memory", "over tcp", "over MPI"), then what
// the transport adds (`detail`, e.g. " (0 done)"). Blames `peer`, the
// awaited one.
[[noreturn]] void throw_no_progress(const Deadline& window, const std::string& doing,
                                    const char* transport, int peer,
                                    const std::string& detail = "");

// A peer's failure, as its transport worded it, with what this rank was
// doing when it learned of it: "<e> while rank 0 was receiving 4096 bytes
// from rank 2 over tcp". Once: an error already framed by an inner wait
// passes as it is. The waits do this themselves; a transport calls it for
// what it learns outside a wait (moving bytes as it posts a request).
[[noreturn]] void throw_in_context(const PeerError& e, const WaitContext& c);

// A transport's name() as errors say it: "shared memory", "tcp", "MPI".
std::string transport_words(const std::string& transport);

}  // namespace rr
