// What a rank does when a collective fails, so that every rank names the
// rank that failed first: it publishes its reason in the rendezvous store
// before it tears down its links (a neighbour that sees them go down then
// finds the reason there), follows chains of timeouts to the rank at their
// end, and raises the first failure's class and culprit.
#pragma once

#include <exception>
#include <string>

#include "common/error.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace rr {

// A failure as published in the store: "kind\npeer\nrank\nfacts\nmessage",
// where facts is a mismatch's MismatchFacts, tab-separated (reason, both
// ranks, both issuer tags in hex, both calls), a peer failure's reason
// (PeerError::reason, e.g. "unreachable"), or empty.
struct FailureRecord {
  static constexpr size_t kMaxMessage = 64 << 10;
  std::string kind;  // "mismatch" | "timeout" | "peer" | "error"
  int peer = -1;
  int rank = -1;
  std::string message;
  MismatchFacts facts;  // a mismatch's, when known
  std::string reason;   // a "peer" failure's PeerError::reason ("" when none)

  std::string encode() const;
  // Never fails: an unknown kind reads as "error", a rank outside
  // [0, world_size) as -1 (no rank), an unknown reason as none, an overlong
  // message is cut.
  static FailureRecord decode(const std::string& text, int world_size);
};

struct FailureOutcome {
  std::exception_ptr error;  // what to raise on this rank
  std::string message;       // why the communicator is broken, for later calls
};

// `error` is what this rank saw while running `description` (e.g.
// "all_reduce(count=10, float32, sum) (call #3)"). Publishes it, aborts
// `transport`, and returns the error to raise: ours, or the first failure's
// if another rank failed before us. Call it with the store's host stop check
// on (HostStopCheck), so that a store host stopped on this machine is named,
// not waited for.
FailureOutcome report_failure(Store& store, const std::string& prefix, Transport& transport,
                              int rank, double timeout, std::exception_ptr error,
                              const std::string& description);

}  // namespace rr
