// The MPI transport: the ring's sends and receives become non-blocking MPI
// point-to-point messages on the channel's private communicator, one tag.
//
// The algorithms treat the link to a peer as a byte stream: a rank may send a
// whole chunk in one isend while its neighbour receives it segment by
// segment. MPI matches whole messages instead, so this transport keeps stream
// semantics on top of them:
//  - a send is cut into messages of at most `piece_bytes` (the communicator's
//    segment size, so that they line up with the receiver's segments; never
//    more than 1 GiB, because MPI counts are ints), a few in flight at once per peer;
//  - a receiver learns the size of each incoming message with MPI_Improbe
//    before it takes it. A message that fits the receive at the head of that
//    peer's queue goes straight into the posted buffer; one that does not is
//    taken into a staging buffer and copied out across the receives.
// MPI delivers the messages of one (sender, receiver, tag) in order, so the
// bytes arrive in stream order.
//
// Progress happens in wait(): it matches arrivals and tests every request in
// flight, never calling a blocking MPI function. It spins briefly, then
// yields, then sleeps in short slices until the deadline. MPI may never
// report a dead peer; the deadline covers that, and a peer whose communicator
// failed says so on the control channel, which ends our wait on it early.
#pragma once

#include <memory>
#include <vector>

#include "transport/mpi/mpi_channel.h"
#include "transport/transport.h"

namespace rr {

class MpiTransport : public Transport {
 public:
  MpiTransport(std::shared_ptr<MpiChannel> channel, size_t piece_bytes);
  ~MpiTransport() override;

  int rank() const override { return channel_->rank(); }
  int size() const override { return channel_->size(); }
  const char* name() const override { return "mpi"; }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  void wait(Request& request, const Deadline& deadline) override;
  void abort() noexcept override;
  TransportStats stats() const override { return stats_; }

 private:
  struct SendOp;
  struct RecvOp;
  struct Link;
  struct InFlight;

  void check_peer(int peer) const;
  Link& link(int peer);
  void post_sends(int peer, Link& out);
  bool progress();
  bool match(int peer, Link& in);
  bool drain_stage(Link& in);
  void track(MPI_Request request, InFlight what);
  void complete(const InFlight& what);
  bool idle() const;
  void last_call(Request& request, const Deadline& deadline);
  [[noreturn]] void fail_timeout(const Request& request, const Deadline& deadline);
  [[noreturn]] void fail_peer_aborted(const Request& request);

  std::shared_ptr<MpiChannel> channel_;
  size_t piece_bytes_;
  std::vector<std::unique_ptr<Link>> links_;  // by peer rank, created on first use
  // Every MPI request in flight, and what each one completes (same index).
  std::vector<MPI_Request> requests_;
  std::vector<InFlight> in_flight_;
  std::vector<InFlight> finished_;  // scratch for progress()
  std::vector<int> completed_;
  std::vector<MPI_Status> statuses_;
  TransportStats stats_;
  bool failed_ = false;
  bool aborted_ = false;
};

}  // namespace rr
