#include "transport/waiter.h"

#include <algorithm>

#include "common/error.h"

namespace rr {

namespace {

// The one loop behind both waits. With a deadline (wait_until_done): until
// done, renewing the window on progress, timing out through timed_out().
// Without (`deadline` null, wait_slice): until done, `until`, or a wake-up,
// never timing out. Returns whether the request is done.
bool drive(Waitable& w, const Deadline* deadline, Clock::time_point until,
           const WaitPolicy& policy) {
  if (w.done()) return true;
  Deadline window = deadline != nullptr ? *deadline : Deadline{};
  uint64_t moved = w.moved();
  const Clock::time_point spin_until = std::min(until, Clock::now() + policy.spin);
  bool spinning = policy.spin.count() > 0;
  const unsigned per_look = std::max(1u, policy.rounds_per_look);
  const unsigned per_check = per_look * std::max(1u, policy.looks_per_check);
  unsigned rounds = 0;
  while (true) {
    const uint32_t armed = w.arm();
    w.progress();
    if (w.done()) return true;
    // While spinning, a round without a look is a few loads.
    if (spinning && ++rounds % per_look != 0) {
      w.pause();
      continue;
    }
    if (deadline != nullptr) {
      const uint64_t now_moved = w.moved();
      if (now_moved != moved) {
        moved = now_moved;
        window = deadline->renewed();
      }
      if (window.expired()) {
        w.timed_out(window);
        if (w.done()) return true;
        throw Error("internal: a wait timed out without an error naming its peer");
      }
    } else if (Clock::now() >= until || w.woken()) {
      return false;
    }
    if (spinning) {
      spinning = Clock::now() < spin_until;
      if (rounds % per_check == 0 || !spinning) {
        w.check_peer();
        if (w.done()) return true;
      }
      w.pause();
      continue;
    }
    w.check_peer();
    if (w.done()) return true;
    // How long the sleep may last: read only here, not on every spinning look.
    const std::chrono::microseconds left =
        deadline != nullptr
            ? std::chrono::milliseconds(std::max(1, window.poll_ms(1 << 30)))
            : std::chrono::duration_cast<std::chrono::microseconds>(
                  std::max(Clock::duration::zero(), until - Clock::now()));
    w.block(armed, std::min(policy.max_sleep, left));
  }
}

}  // namespace

void throw_in_context(const PeerError& e, const WaitContext& c) {
  if (e.framed() || c.rank < 0) throw e;
  throw PeerError(std::string(e.what()) + " while rank " + std::to_string(c.rank) + " was " +
                      c.doing + " over " + transport_words(c.transport),
                  e.peer(), e.reason(), true);
}

void wait_until_done(Waitable& w, const Deadline& deadline, const WaitPolicy& policy) {
  try {
    drive(w, &deadline, Clock::time_point::max(), policy);
  } catch (const PeerError& e) {
    throw_in_context(e, w.context());
  }
}

bool wait_slice(Waitable& w, std::chrono::microseconds slice, const WaitPolicy& policy) {
  try {
    return drive(w, nullptr, Clock::now() + slice, policy);
  } catch (const PeerError& e) {
    throw_in_context(e, w.context());
  }
}

std::string transport_words(const std::string& transport) {
  return transport == "shm" ? "shared memory" : transport == "mpi" ? "MPI" : transport;
}

void throw_no_progress(const Deadline& window, const std::string& doing, const char* transport,
                       int peer, const std::string& detail) {
  throw TimeoutError("no progress for " + format_seconds(window.seconds()) + " s " + doing +
                         " over " + transport_words(transport) + detail,
                     peer);
}

}  // namespace rr
