// A point in time after which a blocking wait gives up. Every wait in the
// engine takes one, so no call can block forever.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace rr {

using Clock = std::chrono::steady_clock;

// "2.5" rather than "2.500000", for error messages.
inline std::string format_seconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", seconds);
  return buf;
}

class Deadline {
 public:
  static Deadline after(double seconds) {
    Deadline d;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds));
    d.seconds_ = seconds;
    return d;
  }
  bool expired() const { return Clock::now() >= at_; }
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
};

}  // namespace rr
