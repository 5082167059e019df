// A point in time after which a blocking wait gives up. Every wait in the
// engine takes one, so no call can block forever.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "common/error.h"

namespace rr {

using Clock = std::chrono::steady_clock;

// "2.5" rather than "2.500000", for error messages.
inline std::string format_seconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", seconds);
  return buf;
}

// Asks, while a wait goes on, whether the caller wants to stop (a Python
// caller pressed Ctrl-C): check() throws to abandon the wait. Called at most
// every `every` while some wait is running.
class Interrupt {
 public:
  explicit Interrupt(std::chrono::milliseconds every) : every_(every) {}
  virtual ~Interrupt() = default;
  virtual void check() const = 0;

  void poll() const {
    const Clock::time_point now = Clock::now();
    if (now < next_) return;
    next_ = now + every_;
    check();
  }

 private:
  std::chrono::milliseconds every_;
  mutable Clock::time_point next_{};
};

// An Interrupt raised by setting a flag from another thread: the caller that
// stopped waiting (Ctrl-C in Work.wait()) sets it, and the thread that runs
// the wait throws Interrupted at its next look.
class FlagInterrupt final : public Interrupt {
 public:
  explicit FlagInterrupt(const std::atomic<bool>& flag)
      : Interrupt(std::chrono::milliseconds(0)), flag_(flag) {}
  void check() const override {
    if (flag_.load()) throw Interrupted("interrupted: the caller stopped waiting (Ctrl-C)");
  }

 private:
  const std::atomic<bool>& flag_;
};

// Either of two: the caller's own (may be null) or another.
class EitherInterrupt final : public Interrupt {
 public:
  EitherInterrupt(const Interrupt* first, const Interrupt& second)
      : Interrupt(std::chrono::milliseconds(0)), first_(first), second_(second) {}
  void check() const override {
    second_.check();
    if (first_ != nullptr) first_->poll();
  }

 private:
  const Interrupt* first_;
  const Interrupt& second_;
};

class Deadline {
 public:
  static Deadline after(double seconds, const Interrupt* interrupt = nullptr) {
    Deadline d;
    d.at_ = Clock::now() +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    d.seconds_ = seconds;
    d.interrupt_ = interrupt;
    return d;
  }
  // A deadline of the same length from now (the window of a wait restarts
  // when the wait makes progress), asking the same Interrupt.
  Deadline renewed() const { return after(seconds_, interrupt_); }
  // Also where a running wait lets its Interrupt (if any) stop it.
  bool expired() const {
    if (interrupt_ != nullptr) interrupt_->poll();
    return Clock::now() >= at_;
  }
  // Milliseconds left, clamped to [0, cap_ms]: the argument for poll().
  int poll_ms(int cap_ms) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, cap_ms));
  }
  // The length of the wait this deadline was created for, for error messages.
  double seconds() const { return seconds_; }

 private:
  Clock::time_point at_{};
  double seconds_ = 0;
  const Interrupt* interrupt_ = nullptr;
};

}  // namespace rr
