// The bulletin: a few words each rank publishes where every peer can read them,
// without a message. Shared memory has one (shm_layout.h); other transports
// have none (Transport::bulletin() is null).
//
// Entries are numbered by the caller (the call's sequence number, from 1) and
// two at a time are kept: entry n sits at place n % 2 until entry n + 2
// replaces it, which publish() does only once every reader of entry n is done
// with it. Its readers are either every peer or only the right neighbour, as
// the publisher says, and a reader is known to be done with entry n once it
// has published its own entry n + 1 (it does at the start of its next call):
// no acknowledgement is written. So a reader never loses an entry it must
// read, and a publisher never runs more than a call ahead of its readers.
//
// The engine publishes every call's header there (algorithms/call_header.h),
// with the data itself for a tiny all_reduce: one write and one read of a
// cache line or two, where messages would cost a round of slots, counters and
// doorbells each way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace rr {

class Bulletin {
 public:
  // What an entry holds: the caller's bytes, at most this many.
  static constexpr size_t kEntryBytes = 120;

  virtual ~Bulletin() = default;

  // Publishes our entry `n` (> 0): waits until entry n - 2's readers are done
  // with it (deadline: TimeoutError or PeerError naming the reader), then
  // writes `bytes` (<= kEntryBytes) of `body`. Readers: every peer if
  // `read_by_all`, else the right neighbour (rank + 1) only.
  virtual void publish(uint64_t n, const void* body, size_t bytes, bool read_by_all,
                       const Deadline& deadline) = 0;
  // Waits for `peer`'s entry n and copies `bytes` of it into `out`. Returns
  // the number of the entry copied: n, or a later one if the peer ran ahead
  // to another entry at that place (a mismatch, which the caller reports).
  // Throws TimeoutError naming the peer if it never publishes, PeerError if
  // it died, gave up or closed.
  virtual uint64_t read(int peer, uint64_t n, void* out, size_t bytes,
                        const Deadline& deadline) = 0;

  // The phase: one more word each rank publishes, a counter it only raises,
  // for calls that read their peers' memory in place (a window all_reduce,
  // algorithms/window_all_reduce.h) and must say how far they have got.
  // A rank that refuses such a call raises it with kPhaseRefused set, so that
  // peers waiting on it fail at once instead of at their deadline.
  // Values are below 2^40.
  static constexpr uint64_t kPhaseRefused = 1ull << 63;
  virtual void raise_phase(uint64_t value) = 0;
  // Waits until `peer`'s phase is at least `value`. Throws Error naming the
  // peer if it refused the call, TimeoutError or PeerError as read() does;
  // `what` says what the wait is for ("rank 1 to reduce block 3 of call #7").
  virtual void await_phase(int peer, uint64_t value, const std::string& what,
                           const Deadline& deadline) = 0;
  // The peer's phase now, without waiting (with kPhaseRefused if it refused).
  virtual uint64_t phase_of(int peer) = 0;
};

}  // namespace rr
