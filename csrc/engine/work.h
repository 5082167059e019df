// A handle on one submitted collective or point-to-point message: completes
// on the engine's thread, waited on by the caller (with the GIL released, in
// the bindings).
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace rr {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Waits until the collective has finished, at most `seconds` (negative: no
  // limit of our own; the collective's deadlines still bound it). Returns
  // whether it finished; rethrows its error if it failed.
  bool wait(double seconds);
  bool done() const;
  const std::string& description() const { return description_; }

  // Worker side.
  void finish(std::exception_ptr error = nullptr);

  // A point-to-point receive: the rank the message came from (-1 until it
  // has arrived, or for anything else).
  int source() const;
  void set_source(int rank);

 private:
  std::string description_;
  int source_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace rr
