// Sleeping on a word of shared memory until another process changes it
// (Linux futex), so that a waiting rank leaves its core to the computation
// instead of spinning, and a rank that publishes wakes it at once.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

namespace rr {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words are 32-bit");

// Sleeps while *word == expected, at most `max`; returns on a wake, a change,
// a signal or the time limit (callers re-check their condition). The word
// lives in memory shared between processes, hence no FUTEX_PRIVATE_FLAG.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                       std::chrono::microseconds max) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(max.count() / 1000000);
  ts.tv_nsec = static_cast<long>((max.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Wakes every process sleeping on `word`.
inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// A doorbell: a counter that publishers bump and waiters sleep on. A waiter
// reads the count before looking for work and sleeps only if it has not
// changed since; a publisher bumps it and makes the (costly) wake call only
// when someone sleeps. Both sides use sequentially consistent operations, so
// a waiter that announces itself is seen by any publisher that bumps after it
// looked.
struct Doorbell {
  std::atomic<uint32_t> count{0};
  std::atomic<uint32_t> sleepers{0};

  uint32_t read() const { return count.load(std::memory_order_seq_cst); }

  void ring() {
    count.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&count);
  }

  // For a publisher whose waiters sleep with sleep_unless: bumps the count
  // and wakes only when someone sleeps, so that a publish nobody waits for
  // costs no write to this line. The publisher's own store must be
  // sequentially consistent, as the sleepers count's load here is.
  void ring_if_sleeping() {
    if (sleepers.load(std::memory_order_seq_cst) != 0) ring();
  }
  // Sleeps until the count moves past `seen`, at most `max`, unless ready()
  // holds once this sleeper is counted: what a ring_if_sleeping() publisher
  // wrote before it looked at the sleepers is seen here, or it saw us.
  template <class Ready>
  void sleep_unless(uint32_t seen, std::chrono::microseconds max, const Ready& ready) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (count.load(std::memory_order_seq_cst) == seen && !ready()) futex_wait(&count, seen, max);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  // Sleeps until the count moves past `seen`, at most `max`.
  void sleep(uint32_t seen, std::chrono::microseconds max) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (count.load(std::memory_order_seq_cst) == seen) futex_wait(&count, seen, max);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
};

}  // namespace rr
