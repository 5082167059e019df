// Point-to-point messages between the ranks of a communicator: send to one
// rank, receive from one rank or from any, matched by tag, as in MPI and
// torch.distributed. They run on a transport of their own (links made beside
// the collectives' ones, see engine/bootstrap.h) and a thread of their own,
// so that they never wait behind a collective, nor a collective behind them,
// and any number may be in flight at once: a rank can post a receive and
// then a send to the same peer, as pipelines do.
//
// On the wire every message is a 24-byte header (magic, tag, size) followed by
// its bytes in segments of the communicator's segment size, one transport
// message each. A receive takes the first message from its source (or from
// any rank) with its tag, in the order the sender sent them; a message that
// arrives before a receive wants it is kept in memory until one does.
// A receive whose size differs from the message's fails with MismatchError
// naming the sender (the message is dropped). Every pending operation gives
// up after the timeout without progress, naming the peer.
//
// The thread waits through the engine's one waiter (transport/waiter.h) for
// any event: a request of any pending operation completing, a new operation,
// close() or interrupt(). Each operation keeps its own clock, so the wait's
// deadline is the earliest of theirs, and each event ends the wait so that
// the clocks are looked at again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/work.h"
#include "transport/transport.h"

namespace rr {

class PointToPoint {
 public:
  PointToPoint(std::unique_ptr<Transport> transport, double timeout_seconds, size_t segment_bytes);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // `data` must stay valid (and, for a send, unchanged) until the Work
  // finishes. src < 0 receives from any rank; the Work's source() says which.
  std::shared_ptr<Work> send(const void* data, size_t bytes, int dst, int64_t tag);
  std::shared_ptr<Work> recv(void* data, size_t bytes, int src, int64_t tag);

  // Gives the sends in flight a moment to leave, then fails whatever is
  // still pending and closes the links. Idempotent.
  void close() noexcept;

  // The caller stopped waiting (Ctrl-C): every pending operation fails as
  // interrupted, the links are torn down so that peers waiting on this rank
  // fail naming it, and later calls are refused. Safe from any thread.
  void interrupt() noexcept;

  const char* transport_name() const { return transport_->name(); }
  TransportStats stats() const;

 private:
  struct Op;
  struct Incoming;  // a peer's next message, header first
  struct Kept;      // a message that arrived before any receive wanted it
  class Events;     // the loop's wait for any event, as the waiter drives it

  // Queues an op for the thread (refused once closing or broken).
  std::shared_ptr<Work> submit(const std::shared_ptr<Op>& op);
  void loop();
  void take_new_ops(std::deque<std::shared_ptr<Op>>& ops);
  void post_send(const std::shared_ptr<Op>& op);
  bool match_kept(const std::shared_ptr<Op>& op);
  void post_headers();
  bool advance();  // completes what can complete; true if anything did
  void on_header(int peer);
  void check_deadlines();
  bool pending() const;
  double seconds_to_first_deadline() const;
  void fail_all(std::exception_ptr error);
  RequestPtr any_request() const;

  int rank_;
  int size_;
  double timeout_;
  size_t segment_;
  std::unique_ptr<Transport> transport_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> submitted_;  // not yet seen by the thread
  bool closing_ = false;
  std::string broken_;  // the first failure, after which every call is refused
  TransportStats stats_;
  std::atomic<uint64_t> submitted_count_{0};  // operations submitted so far
  std::atomic<bool> stop_{false};             // close() or interrupt() was called
  std::atomic<bool> interrupted_{false};
  FlagInterrupt interrupt_{interrupted_};

  // The thread's own state.
  std::deque<std::shared_ptr<Op>> sends_;            // in flight
  std::list<std::shared_ptr<Op>> recvs_;             // posted, not yet matched, in posting order
  std::vector<std::unique_ptr<Incoming>> incoming_;  // by peer
  std::deque<std::unique_ptr<Kept>> kept_;           // in arrival order
  uint64_t taken_ = 0;                               // operations taken from submitted_
  uint64_t events_ = 0;                              // requests completed so far
  std::thread thread_;
};

}  // namespace rr
