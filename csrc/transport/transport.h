// The transport interface: the only thing the algorithms see.
//
// A transport moves messages between ranks. It knows nothing of dtypes or
// collectives. A message is one segment of a step (algorithms/ring_schedule.h):
// both ends agree on its size, so a receive is posted for exactly the bytes
// the matching send carries, and no transport has to cut or reassemble a
// stream. Messages between one (sender, receiver) pair are delivered in the
// order they were posted, and receives from one peer are matched in the order
// they were posted, so the algorithms need no tags.
//
// A receive lands either in the caller's memory (irecv) or in memory the
// transport owns (irecv_view). A view lets the algorithm reduce straight out
// of the transport's buffer, which for shared memory is the sender's slot:
// no intermediate copy. The algorithm releases each view once it has read it.
//
// Progress happens inside wait(): the calling thread (the communicator's worker
// thread) drives every outstanding request of this transport, not only the one
// it waits for, so a large send keeps moving while the caller waits for a
// receive. Every wait has a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace rr {

class Bulletin;  // transport/bulletin.h

// "sending 4000 bytes to rank 2", "receiving 64 bytes from rank 0": a message
// as waits and their errors name it.
inline std::string describe_message(bool sending, size_t bytes, int peer) {
  return std::string(sending ? "sending " : "receiving ") + std::to_string(bytes) + " bytes " +
         (sending ? "to" : "from") + " rank " + std::to_string(peer);
}

// A posted send or receive. It completes inside Transport::wait().
class Request {
 public:
  virtual ~Request() = default;
  virtual bool done() const = 0;
  virtual int peer() const = 0;
  // Whether it sends to peer() (else it receives from it), and what it is, for
  // waits and their errors.
  virtual bool sending() const { return false; }
  virtual std::string what() const { return "waiting on rank " + std::to_string(peer()); }
  // For a receive posted with irecv_view: the message, in the transport's
  // memory, from completion until Transport::release(). Null otherwise.
  virtual const char* view() const { return nullptr; }
};
using RequestPtr = std::shared_ptr<Request>;

struct TransportStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  // Set up, once: what a shrink let this transport take over from the one it
  // replaced (engine/bootstrap.cc), and what it connected anew.
  int tcp_links_reused = 0;     // TCP ring links taken over
  int tcp_links_connected = 0;  // TCP ring links connected anew
  int shm_peers_reused = 0;     // local peers whose shared memory was taken over
};

// A range of memory: where a transport's views lie (Transport::view_region).
struct MemoryRange {
  char* data = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  // A transport lends at least this many views per peer at once; an
  // algorithm never holds more (posted or completed, not yet released).
  static constexpr int kMaxViews = 4;

  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // Posts one message of `bytes` bytes to `peer`. `data` must stay valid
  // until the request completes. A zero-byte message is not sent at all (and
  // the receiver posts nothing for it): the request is done at once.
  virtual RequestPtr isend(int peer, const void* data, size_t bytes) = 0;
  // Posts the receive of one message of exactly `bytes` bytes into `data`.
  virtual RequestPtr irecv(int peer, void* data, size_t bytes) = 0;
  // Posts the receive of one message of exactly `bytes` (> 0) bytes into
  // memory the transport owns; once done, request.view() points at it.
  virtual RequestPtr irecv_view(int peer, size_t bytes) = 0;
  // Gives a completed view back. Views from one peer are released in the
  // order they were posted.
  virtual void release(Request& view) = 0;
  // Where views of `bytes`-byte messages from `peer` will be the message in
  // place: a range of this transport's own memory, mapped as long as the
  // transport is (for shared memory, the home segment that holds the inbox
  // `peer` writes), in whole pages. A view that
  // lies inside it was not copied to be lent; the range is what a device
  // page-locks to copy such views straight onto itself. Empty where views
  // from `peer` of that size are copies (sockets, MPI, shared-memory messages
  // by address or over several slots).
  virtual MemoryRange view_region(int peer, size_t bytes) {
    (void)peer;
    (void)bytes;
    return {};
  }

  // Sending without the transport's copy: lend() gives the memory the next
  // message to `peer`, of `bytes` bytes, will travel in (for shared memory,
  // the free slot of peer's inbox that comes next), or null where it cannot
  // now (no such memory, no free slot, an earlier send still queued). The
  // caller fills it, then posts it with isend_lent(): the message is the
  // bytes the memory holds then. Lent memory is posted in the order it was
  // lent, before anything else is sent to `peer` (which would otherwise queue
  // behind it), and lies inside lend_region(peer): mapped as long as the
  // transport is, in whole pages, what a device page-locks to copy into it.
  virtual MemoryRange lend_region(int peer) {
    (void)peer;
    return {};
  }
  virtual char* lend(int peer, size_t bytes) {
    (void)peer;
    (void)bytes;
    return nullptr;
  }
  virtual RequestPtr isend_lent(int peer, char* lent, size_t bytes) {
    (void)peer;
    (void)lent;
    (void)bytes;
    return nullptr;
  }

  // Drives progress until `request` completes. Throws TimeoutError when no
  // byte has moved for the deadline's length (so a long transfer on a slow
  // link is not a timeout), and PeerError when the peer's connection fails.
  // After a throw the transport is unusable.
  virtual void wait(Request& request, const Deadline& deadline) = 0;

  // For a transport made of others (one per kind of link, routed.h), which
  // drives all of them while it waits on one:
  //  - progress() moves whatever can move now, without blocking; true if
  //    anything moved;
  //  - wait_for() waits like wait(), but at most `slice`, and returns whether
  //    the request completed; it throws for failures it sees (a dead peer),
  //    never for time: the caller keeps the deadline.
  virtual bool progress() = 0;
  virtual bool wait_for(Request& request, std::chrono::microseconds slice) = 0;
  // The one call safe from another thread: makes a wait_for() in progress
  // (or the next one) return soon, so that a thread serving several requests
  // can take new work. By default waits just run out their slice.
  virtual void wake() {}
  // How long waits spin before they sleep: eager (the configured spin) for a
  // call run on the caller's thread, where latency is what counts; polite
  // (barely) for a collective in the background, where a spinning thread
  // would take a core from the computation it overlaps.
  virtual void set_eager(bool eager) { (void)eager; }

  // True when this transport carries messages both to and from `peer` now.
  virtual bool reaches(int peer) const = 0;
  // True when it can: at once, or by connecting on first use (TCP links
  // beyond the ring neighbours). Collectives that talk to any peer
  // (all_to_all, gather, scatter) need this of every peer.
  virtual bool connects(int peer) const { return reaches(peer); }

  // After a failure: stops every connection, and tells the peers, so that
  // peers blocked on us fail fast instead of waiting for their deadline. A
  // transport may keep its connections to live peers open but unused (TCP
  // parks them, for a shrink to take over); close() ends them. Safe to call
  // more than once, and from the error path.
  virtual void abort() noexcept = 0;
  // Before abort(): the failure involves a rank that stays silent (a timeout,
  // an unreachable machine), so a transport that tells only some peers at
  // abort() and counts on them to pass it on (TCP) must tell all it can.
  virtual void note_silent() noexcept {}
  // The normal end, when the peers ran the same collectives: tears down
  // without telling anyone of a failure. Idempotent.
  virtual void close() noexcept { abort(); }

  virtual TransportStats stats() const = 0;
  // What has moved to `peer` (sending) or from it so far, as this transport
  // counts it (bytes or messages; monotonic): a wait on a request to or from
  // `peer` renews its deadline when this changes, and traffic with other peers
  // never does. By default everything this transport moved, for transports
  // that cannot tell peers apart.
  virtual uint64_t moved(int peer, bool sending) const {
    (void)peer;
    (void)sending;
    const TransportStats s = stats();
    return s.bytes_sent + s.bytes_received;
  }
  // The bulletin (transport/bulletin.h) over every rank of the communicator, or null
  // where this transport has none.
  virtual Bulletin* bulletin() { return nullptr; }
  // The transports that carry this one's messages: itself, or those it routes
  // through or wraps. Where a shrink finds the links and the memory it can
  // take over (engine/bootstrap.cc).
  virtual void parts(std::vector<Transport*>& out) { out.push_back(this); }
};

}  // namespace rr
