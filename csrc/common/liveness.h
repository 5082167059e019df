// Knowing within moments that a peer's process ended, for transports that
// cannot tell (MPI reports a dead peer, if at all, when its own timeout or
// the launcher's cleanup comes). Every rank holds one TCP connection to every
// other rank, on which nothing is ever sent but a goodbye when the
// communicator closes. The kernel closes a process's sockets however it ends
// (kill -9, a crash, exit without closing), so a watcher thread that sees a
// connection close without a goodbye knows that rank died.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"

namespace rr {

class Liveness {
 public:
  enum class State : uint8_t { kAlive = 0, kLeft = 1, kDied = 2 };
  // Returns every rank's text, in rank order, given ours (an allgather).
  using Allgather = std::function<std::vector<std::string>(const std::string&)>;

  // Listens on `advertise` (an address the other ranks reach us at), learns
  // the others' addresses through `allgather`, connects to every higher rank
  // and accepts every lower one, each proving `instance` (a number every
  // rank of this communicator shares) in its hello.
  static std::unique_ptr<Liveness> connect(int rank, int size, uint64_t instance,
                                           const std::string& advertise, const Allgather& allgather,
                                           const Deadline& deadline);
  ~Liveness();  // says goodbye to every peer, then closes
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  State state(int peer) const { return states_[static_cast<size_t>(peer)].load(); }
  // The lowest rank whose process died, or -1.
  int first_died() const;
  // "rank 3's process ended (...)": why `peer` is gone, for error messages.
  static std::string describe(int peer, State state);

 private:
  Liveness(int rank, int size);
  void watch();

  int rank_;
  int size_;
  std::vector<Fd> fds_;  // by rank; none for ourselves
  std::unique_ptr<std::atomic<State>[]> states_;
  Fd wake_;  // an eventfd that stops the watcher
  std::thread watcher_;
};

}  // namespace rr
