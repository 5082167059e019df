// The shared-memory transport's inner parts, shared by its source files
// (shm_transport.cc: connecting, queues and progress; shm_wait.cc: waiting,
// liveness and blame). Not part of the engine's interface.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/shm/shm_transport.h"

namespace rr {
namespace shm {

// A pidfd for `pid` (readable once it exits), or -1 where the kernel has none.
int pidfd_open(pid_t pid);
// Reads `bytes` at `remote` in process `pid` into `local`; false when the
// kernel refuses (no permission), errno set.
bool read_remote(pid_t pid, void* local, uint64_t remote, size_t bytes);
inline std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

// Whether local rank `l` (global rank local_ranks[l]) is next to us, local rank
// `me`, in a ring: the communicator's (ranks in order) or this host's (local
// ranks in order, as hierarchical all_reduce runs it).
inline bool ring_neighbour(int rank, int size, const std::vector<int>& local_ranks, int l, int me) {
  const int r = local_ranks[static_cast<size_t>(l)];
  const int local_size = static_cast<int>(local_ranks.size());
  return r == (rank + 1) % size || r == (rank + size - 1) % size || l == (me + 1) % local_size ||
         l == (me + local_size - 1) % local_size;
}

}  // namespace shm

// A send or a receive. A receive into a view either points into its inbox
// slot (`slot_index`, released by release()) or owns a bounce buffer.
struct ShmTransport::Op : Request {
  Op(int peer, char* data, size_t bytes, bool sending)
      : peer_(peer), data(data), bytes(bytes), sending_(sending) {}
  bool done() const override { return done_; }
  int peer() const override { return peer_; }
  const char* view() const override { return is_view && done_ ? view_ptr : nullptr; }
  bool sending() const override { return sending_; }
  std::string what() const override { return describe_message(sending_, bytes, peer_); }

  int peer_;
  char* data;
  size_t bytes;
  bool sending_;
  bool done_ = false;
  size_t moved = 0;  // inline fragments: bytes copied so far
  // Sends by address: the message's index in the peer's inbox; done once
  // the receiver has released it.
  uint64_t index = 0;
  bool is_view = false;
  const char* view_ptr = nullptr;
  bool holds_slot = false;  // the view is an inbox slot, released by release()
  uint64_t slot_index = 0;
  ViewPool::Slot bounce;
};

// One rank on this host, seen from here: its mapped home segment, our inbox
// in it (we send), its inbox in ours (we receive), and the operations queued
// on each.
struct ShmTransport::Peer {
  int rank = -1;
  int local = -1;
  pid_t pid = 0;
  Fd pidfd;
  shm::Segment segment;  // its home segment, mapped here
  shm::Header* header = nullptr;

  shm::InboxControl* out = nullptr;  // our inbox in its segment: we write
  uint64_t out_head = 0;
  std::vector<size_t> reserved;           // by slot: bytes reserved from its start
  bool by_address = false;                // it can read our memory: large sends go by address
  std::deque<std::shared_ptr<Op>> sends;  // not yet (fully) published
  std::deque<std::shared_ptr<Op>> by_address_sent;  // published by address, not yet read
  // Slots lent (ShmTransport::lend), not yet posted, in order: their indices
  // and data. head stops at the first.
  struct Lent {
    uint64_t index;
    char* data;
  };
  std::deque<Lent> lent;

  shm::InboxControl* in = nullptr;  // its inbox in our segment: we read
  uint64_t in_next = 0;             // next message to take
  uint64_t in_tail = 0;             // released so far (our copy of in->tail)
  std::vector<uint8_t> consumed;    // by slot: taken and done with, not yet released
  std::deque<std::shared_ptr<Op>> recvs;

  uint64_t moved = 0;  // messages moved either way: how a wait tells progress
};

}  // namespace rr
