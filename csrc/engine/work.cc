#include "engine/work.h"

#include <chrono>

namespace rr {

bool Work::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (seconds < 0) {
    cv_.wait(lock, [this] { return finished_; });
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                           [this] { return finished_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

int Work::source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

void Work::set_source(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  source_ = rank;
}

}  // namespace rr
