// The MPI transport: every message of the algorithms (one segment) is one
// non-blocking MPI message on the channel's private communicator, one tag.
// Both ends agree on message sizes (transport.h), so a receive is posted
// straight into its buffer before the message arrives, and a message of
// another size is a protocol error, reported as such.
//
// Sends to one peer are handed to MPI in order, a few at a time: more would
// not move bytes faster (a peer takes its messages in order) and would only
// lengthen every MPI_Testsome when a collective posts thousands of segments.
// Receives are posted at once; MPI matches them in posting order.
//
// Progress happens in wait(): it tests every request in flight, never calling
// a blocking MPI function. It spins briefly, then yields, then sleeps in short
// slices until the deadline. MPI may never report a dead peer; the deadline
// covers that, and a peer whose communicator failed says so on the control
// channel, which ends our wait on it early.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "transport/mpi/mpi_channel.h"
#include "transport/transport.h"
#include "transport/view_pool.h"

namespace rr {

class MpiTransport : public Transport {
 public:
  explicit MpiTransport(std::shared_ptr<MpiChannel> channel);
  ~MpiTransport() override;

  int rank() const override { return channel_->rank(); }
  int size() const override { return channel_->size(); }
  const char* name() const override { return "mpi"; }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  RequestPtr irecv_view(int peer, size_t bytes) override;
  void release(Request& view) override;
  void wait(Request& request, const Deadline& deadline) override;
  bool progress() override;
  bool wait_for(Request& request, std::chrono::microseconds slice) override;
  void wake() override { wakes_.fetch_add(1); }
  bool reaches(int peer) const override { return peer >= 0 && peer < size() && peer != rank(); }
  void abort() noexcept override;
  void close() noexcept override;
  TransportStats stats() const override { return stats_; }

 private:
  struct Op;
  struct Waiting;  // one wait() as the waiter sees it (transport/waiter.h)
  struct Link;

  void check_peer(int peer) const;
  Link& link(int peer);
  RequestPtr post_recv(std::shared_ptr<Op> op);
  void post_sends(Link& out);
  void complete(Op& op, const MPI_Status& status);
  bool idle() const;
  // Throws PeerError naming a rank whose process ended, if one stalls this wait.
  void check_liveness(const Request& request, Clock::time_point moved_at);
  void last_call(Request& request, const Deadline& deadline);
  [[noreturn]] void fail_timeout(const Request& request, const Deadline& deadline);
  [[noreturn]] void fail_peer_aborted(const Request& request);

  std::shared_ptr<MpiChannel> channel_;
  std::vector<std::unique_ptr<Link>> links_;  // by peer rank, created on first use
  // Every MPI request in flight, and the operation it completes (same index).
  std::vector<MPI_Request> requests_;
  std::vector<std::shared_ptr<Op>> in_flight_;
  std::vector<std::shared_ptr<Op>> finished_;  // scratch for progress()
  std::vector<int> completed_;
  std::vector<MPI_Status> statuses_;
  TransportStats stats_;
  std::atomic<uint64_t> wakes_{0};
  bool failed_ = false;
  bool aborted_ = false;
};

}  // namespace rr
