#include "transport/waiter.h"

#include <algorithm>

#include "common/error.h"

namespace rr {

void wait_until_done(Waitable& w, const Deadline& deadline, const WaitPolicy& policy) {
  if (w.done()) return;
  Deadline window = deadline;
  uint64_t moved = w.moved();
  const Clock::time_point spin_until = Clock::now() + policy.spin;
  bool spinning = policy.spin.count() > 0;
  const unsigned per_look = std::max(1u, policy.rounds_per_look);
  const unsigned per_check = per_look * std::max(1u, policy.looks_per_check);
  unsigned rounds = 0;
  while (true) {
    const uint32_t armed = w.arm();
    w.progress();
    if (w.done()) return;
    // While spinning, a round without a look is a few loads.
    if (spinning && ++rounds % per_look != 0) {
      w.pause();
      continue;
    }
    const uint64_t now_moved = w.moved();
    if (now_moved != moved) {
      moved = now_moved;
      window = deadline.renewed();
    }
    if (window.expired()) {
      w.timed_out(window);
      if (w.done()) return;
      throw Error("internal: a wait timed out without an error naming its peer");
    }
    if (spinning) {
      spinning = Clock::now() < spin_until;
      if (rounds % per_check == 0 || !spinning) {
        w.check_peer();
        if (w.done()) return;
      }
      w.pause();
      continue;
    }
    w.check_peer();
    if (w.done()) return;
    const auto left = std::chrono::milliseconds(std::max(1, window.poll_ms(1 << 30)));
    w.block(armed, std::min<std::chrono::microseconds>(policy.max_sleep, left));
  }
}

void throw_no_progress(const Deadline& window, const std::string& doing, const char* transport,
                       int peer, const std::string& detail) {
  const std::string name = transport;
  const std::string over = name == "shm" ? "shared memory" : name == "mpi" ? "MPI" : name;
  throw TimeoutError(
      "no progress for " + format_seconds(window.seconds()) + " s " + doing + " over " + over + detail,
      peer);
}

}  // namespace rr
