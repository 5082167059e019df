// A wait on a stalled peer while other traffic keeps moving, through the
// real routed transport and waiter over two scripted parts, for the tests of
// the waiter's progress rule: only what moves with the awaited peer renews a
// wait's window, so the rank waiting on a stalled peer times out on time and
// names it, however busy its other links are.
#pragma once

#include <string>

namespace rr::testing {

struct StalledWait {
  double seconds = 0;  // how long the wait lasted
  std::string kind;    // "timeout", "peer", "error", or "done" (it never completes)
  int peer = -1;       // whom the error blames
  std::string message;
};

// Rank 0 of 4 waits, with a `timeout` s deadline, for 8 bytes from `awaited`
// that never come. Two parts carry the ranks: "near" reaches rank 1, "far"
// ranks 2 and 3. Meanwhile rank `busy` moves a message every 100 us for
// `busy_seconds` (on its part: the awaited's own, or the other one).
StalledWait stalled_wait(int awaited, int busy, double busy_seconds, double timeout);

}  // namespace rr::testing
