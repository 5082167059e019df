// How one call runs, decided once (choose) and read by everyone who needs it:
// the dispatch that runs it (engine/dispatch.h), the stats, the log line of
// RINGREDUCE_DEBUG=algorithm and the cost model (explain, _core.engine_algorithm).
//
// A call runs on one of three routes: the bulletin (a tiny all_reduce on
// shared memory: one entry written, N - 1 read, no message), the windows
// (every buffer in comm.empty memory: the ranks read each other's buffers in
// place), or a schedule on an executor (every other call; for all_reduce, one
// of the algorithms). Every rank decides from the call's header fields and
// what all ranks share (the hosts, the settings), never from where its own
// buffers live, except for windows, which the call header compares: host and
// device ranks meet in one call.
#pragma once

#include <cstdint>
#include <string>

#include "algorithms/collective.h"

namespace rr {

enum class Route : uint8_t {
  kBulletin,  // algorithms/bulletin_all_reduce.h
  kWindow,    // algorithms/window_all_reduce.h
  kSchedule,  // the call header, then the schedule on an executor
};
const char* route_name(Route route);

// Why the choice is what it is, for explain(); decided with it.
enum class Reason : uint8_t {
  kOneRank,         // nothing to exchange
  kNotAllReduce,    // one schedule per collective: no choice to make
  kPolicyRing,      // RINGREDUCE_ALGORITHM=ring
  kPolicyHier,      // RINGREDUCE_ALGORITHM=hierarchical, and it can run
  kPolicyHierNot,   // RINGREDUCE_ALGORITHM=hierarchical, but it cannot run here
  kWindows,         // every buffer in a window, the ranks on one host
  kSmallMessage,    // at most the small-message limit: latency-bound
  kLargeMessage,    // above it: bandwidth-bound
};

struct Choice {
  Route route = Route::kSchedule;
  Algorithm algorithm = Algorithm::kRing;  // all_reduce's; kRing for the other collectives
  Reason reason = Reason::kNotAllReduce;
};

Choice choose(const RingContext& ctx, const CollectiveArgs& args);

// Why `choice` (choose's for this call) is what it is, in a sentence that ends
// with the algorithm's name for all_reduce. Words only: every decision is
// choose's.
std::string explain(const Choice& choice, const RingContext& ctx, const CollectiveArgs& args);

}  // namespace rr
