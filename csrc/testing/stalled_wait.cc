#include "testing/stalled_wait.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/routed.h"
#include "transport/transport.h"

namespace rr::testing {
namespace {

constexpr int kRanks = 4;

// A message that never arrives (or never leaves).
struct Never final : Request {
  Never(int peer, size_t bytes, bool sending) : peer_(peer), bytes(bytes), sending_(sending) {}
  bool done() const override { return false; }
  int peer() const override { return peer_; }
  bool sending() const override { return sending_; }
  std::string what() const override { return describe_message(sending_, bytes, peer_); }
  int peer_;
  size_t bytes;
  bool sending_;
};

// A part that reaches `peers`, on which nothing it is asked to carry ever
// moves, while rank `busy` (when it is one of them) moves a message every
// progress() at least 100 us apart until `busy_until`.
class ScriptedPart final : public Transport {
 public:
  ScriptedPart(std::string name, std::vector<int> peers, int busy, Clock::time_point busy_until)
      : name_(std::move(name)), peers_(std::move(peers)), busy_(busy), busy_until_(busy_until) {}

  int rank() const override { return 0; }
  int size() const override { return kRanks; }
  const char* name() const override { return name_.c_str(); }
  RequestPtr isend(int peer, const void*, size_t bytes) override {
    return std::make_shared<Never>(peer, bytes, true);
  }
  RequestPtr irecv(int peer, void*, size_t bytes) override {
    return std::make_shared<Never>(peer, bytes, false);
  }
  RequestPtr irecv_view(int peer, size_t bytes) override {
    return std::make_shared<Never>(peer, bytes, false);
  }
  void release(Request&) override {}
  void wait(Request&, const Deadline&) override {
    throw Error("a scripted part is waited on through the routed transport");
  }
  bool progress() override {
    if (!reaches(busy_)) return false;
    const Clock::time_point now = Clock::now();
    if (now >= busy_until_ || now < next_) return false;
    next_ = now + std::chrono::microseconds(100);
    ++moved_[busy_];
    return true;
  }
  bool wait_for(Request& request, std::chrono::microseconds slice) override {
    progress();
    std::this_thread::sleep_for(std::min(slice, std::chrono::microseconds(100)));
    progress();
    return request.done();
  }
  bool reaches(int peer) const override {
    return std::find(peers_.begin(), peers_.end(), peer) != peers_.end();
  }
  void abort() noexcept override {}
  TransportStats stats() const override { return {}; }
  uint64_t moved(int peer, bool) const override {
    const auto it = moved_.find(peer);
    return it == moved_.end() ? 0 : it->second;
  }

 private:
  std::string name_;
  std::vector<int> peers_;
  int busy_;
  Clock::time_point busy_until_;
  Clock::time_point next_{};
  std::map<int, uint64_t> moved_;
};

}  // namespace

StalledWait stalled_wait(int awaited, int busy, double busy_seconds, double timeout) {
  if (awaited < 1 || awaited >= kRanks || busy < 1 || busy >= kRanks) {
    throw InvalidArgument("awaited and busy must be ranks 1..3");
  }
  const Clock::time_point busy_until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(busy_seconds));
  std::vector<std::unique_ptr<Transport>> parts;
  parts.push_back(std::make_unique<ScriptedPart>("near", std::vector<int>{1}, busy, busy_until));
  parts.push_back(
      std::make_unique<ScriptedPart>("far", std::vector<int>{2, 3}, busy, busy_until));
  RoutedTransport routed(std::move(parts), "near+far");
  char byte[8];
  RequestPtr request = routed.irecv(awaited, byte, sizeof byte);
  StalledWait out;
  const Clock::time_point start = Clock::now();
  try {
    routed.wait(*request, Deadline::after(timeout));
    out.kind = "done";
  } catch (const TimeoutError& e) {
    out = {0, "timeout", e.peer(), e.what()};
  } catch (const PeerError& e) {
    out = {0, "peer", e.peer(), e.what()};
  } catch (const std::exception& e) {
    out = {0, "error", -1, e.what()};
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace rr::testing
