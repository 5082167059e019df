// The shared-memory transport: ranks on one host exchange messages through
// each other's home segments (shm_layout.h), never through the kernel's
// network stack.
//
// Sending to a peer writes a slot of the peer's inbox for us; receiving reads
// a slot of our inbox for that peer, and a view (irecv_view) is the slot
// itself, so the algorithm reduces straight out of shared memory. The slots
// are few and small (8 of one segment each) and stay in the cache, so this
// costs about the memory traffic of a single copy: the sender reads its data
// once, the receiver writes (or reduces into) its destination once.
//
// Messages of at least `cma_min_bytes` can instead go by address, where the
// kernel allows cross-memory attach: the receiver copies them out of the
// sender's buffer with process_vm_readv, and the sender's request completes
// once they have been read. It saves the CPU one copy, but pinning the
// sender's pages costs more than the copy it saves on the machines measured
// (README, Performance), so it is off unless RINGREDUCE_SHM_SINGLE_COPY_BYTES
// asks for it.
//
// Segments are memfds: no name in /dev/shm, nothing left behind when ranks
// exit or are killed. A peer maps ours through /proc/<pid>/fd/<n>, checked
// before it is trusted (shm_segment.h); once every peer has, we close the fd
// and the memory lives as long as a mapping does.
//
// Waiting spins for `spin` (a neighbour's message is usually microseconds
// away), then sleeps on this rank's doorbell (a futex), which peers ring when
// they publish for us. With more ranks on the host than cores it yields the
// core instead of spinning: the peer it waits for may need that very core.
// A wait on a peer that died (its pidfd becomes readable) or gave up (its
// aborted flag) fails within a sleep slice (100 ms), naming it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/socket.h"
#include "rendezvous/store.h"
#include "transport/bulletin.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"
#include "transport/view_pool.h"
#include "transport/waiter.h"

namespace rr {

class ShmTransport;

struct ShmSettings {
  size_t slots = 8;                    // slots per inbox
  size_t slot_bytes = 256 << 10;       // data bytes per slot
  size_t cma_min_bytes = 32 << 10;     // messages from this size go by address, if allowed
  std::chrono::microseconds spin{50};  // spinning before a wait sleeps
  // Yield, don't spin, even when the local ranks have a core each (connect sets
  // it too when they do not: more local ranks than CPUs in the union of their
  // affinity masks).
  bool oversubscribed = false;
  bool log = false;  // say on stderr, once, how waits will go (RINGREDUCE_DEBUG=algorithm)
  // Tests: release() overwrites a view's bytes before the sender may reuse its
  // slot, so that anything still reading a view after giving it back (a copy
  // queued on a device) reads garbage at once, not only when the slot comes
  // round again. Set with the fake device (Options::fake_device).
  bool poison_released = false;
};

// What a shrink's transport may take over: the revoked communicator's shared
// memory transport (null: none here) and, for each new rank, its rank there.
struct ShmReuse {
  ShmTransport* parent = nullptr;
  std::vector<int> old_ranks;
};

class ShmTransport : public Transport, public Bulletin {
 public:
  // Maps the home segments of every rank in `local_ranks` (global ranks on
  // this host, ascending, `rank` among them), meeting through `store` under
  // `prefix`. Collective over those ranks.
  //
  // `reuse` (a shrink; every local rank passes one, or none does): when every
  // local rank's revoked transport still holds its segment and its mappings of
  // the others' (abort() parks them), the new transport takes them over
  // instead of making and mapping new ones (shm_reuse.cc). Each rank empties
  // its inboxes of what the revoked communicator left there and clears its
  // flags and bulletin, and nobody sends before everyone has.
  static std::unique_ptr<ShmTransport> connect(Store& store, const std::string& prefix, int rank,
                                               int size, const std::vector<int>& local_ranks,
                                               const ShmSettings& settings,
                                               const Deadline& deadline,
                                               const ShmReuse* reuse = nullptr);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "shm"; }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  RequestPtr irecv_view(int peer, size_t bytes) override;
  void release(Request& view) override;
  // Our home segment, which holds the inbox `peer` writes, for messages that
  // fit one slot and come inline.
  MemoryRange view_region(int peer, size_t bytes) override;
  // peer's home segment as mapped here; lend() reserves the next slot of our
  // inbox in it, for a message that fits one slot, and isend_lent() publishes
  // it inline. A reserved slot holds back the publication of every message
  // after it (head counts published messages in order).
  MemoryRange lend_region(int peer) override;
  char* lend(int peer, size_t bytes) override;
  RequestPtr isend_lent(int peer, char* lent, size_t bytes) override;
  void wait(Request& request, const Deadline& deadline) override;
  bool progress() override;
  bool wait_for(Request& request, std::chrono::microseconds slice) override;
  void wake() override;
  bool reaches(int peer) const override;
  void set_eager(bool eager) override { eager_ = eager; }
  // Tells the peers (the aborted flag) and parks: the memory stays mapped, for
  // a shrink to take over, until close().
  void abort() noexcept override;
  void close() noexcept override;
  // With the local peers whose shared memory it took over (a shrink).
  TransportStats stats() const override {
    TransportStats s = stats_;
    s.shm_peers_reused = peers_reused_;
    return s;
  }
  // Messages moved with `peer`, either way (shm counts them per peer).
  uint64_t moved(int peer, bool sending) const override;

  // True when large messages to `peer` go by address (cross-memory attach).
  bool single_copy_to(int peer) const;

  // The bulletin (transport/bulletin.h, shm_bulletin.cc), when every rank of the
  // communicator is on this host.
  Bulletin* bulletin() override { return bulletin_ok_ ? this : nullptr; }
  void publish(uint64_t n, const void* body, size_t bytes, bool read_by_all,
               const Deadline& deadline) override;
  uint64_t read(int peer, uint64_t n, void* out, size_t bytes, const Deadline& deadline) override;
  void raise_phase(uint64_t value) override;
  void await_phase(int peer, uint64_t value, const std::string& what,
                   const Deadline& deadline) override;
  uint64_t phase_of(int peer) override;

 private:
  struct Op;
  struct Peer;
  struct Waiting;  // one wait() as the waiter sees it (transport/waiter.h)

  ShmTransport(int rank, int size, const ShmSettings& settings);
  // Whether this parked transport holds its segment and its mappings of the
  // segments of `old` (ranks of its communicator): what take_over() needs.
  bool can_hand_over(const std::vector<int>& old) const;
  // connect()'s other way (shm_reuse.cc): the new transport from `parent`'s memory.
  static std::unique_ptr<ShmTransport> take_over(ShmTransport& parent, Store& store,
                                                 const std::string& prefix, int rank, int size,
                                                 const std::vector<int>& local_ranks,
                                                 const std::vector<int>& old_ranks,
                                                 const ShmSettings& settings,
                                                 const Deadline& deadline);
  Peer& peer(int rank);
  void decide_waits();
  RequestPtr post_recv(std::shared_ptr<Op> op);
  bool progress_sends(Peer& p);
  // Stores p's inbox head: every message reserved so far, up to the first
  // lent slot not yet posted.
  void publish(Peer& p);
  bool progress_recvs(Peer& p);
  void consume(Peer& p, uint64_t index);
  // Reserve the pages of our inbox in p's segment before we first write them
  // (shm_segment.h): all of it, or what message `index` needs of its slot `s`.
  void reserve_inbox(Peer& p);
  void reserve_slot(Peer& p, shm::SlotHeader* s, uint64_t index, size_t need);
  std::string in_segment_of(const Peer& p) const;
  void pause() const;
  std::chrono::microseconds spin() const;
  // How wait() and wait_for() drive the waiter (shm_wait.cc).
  WaitPolicy wait_policy() const;
  // Throws PeerError when `p` died, gave up or closed while `op` waits on it
  // (after taking what it published before, which may complete op).
  void check_peer(Peer& p, const Op& op);
  // The number of `p`'s latest bulletin entry (0: none yet).
  uint64_t latest_entry(const Peer& p) const;
  // Whether `p` gave up, died or closed (in that order of precedence).
  enum class Gone { kNo, kAborted, kDead, kClosed };
  Gone peer_gone(Peer& p) const;
  // Throws the PeerError naming `p` for `gone`: what we learned of it (the
  // waiter adds what this rank was waiting for).
  [[noreturn]] void blame(Peer& p, Gone gone) const;
  // Waits, as wait() does, until ready() holds, blaming `awaited`; `what`
  // names what we wait for ("entry 7 of its bulletin").
  template <class Ready>
  void bulletin_wait(Peer& awaited, const Ready& ready, const std::string& what,
                 const Deadline& deadline);
  [[noreturn]] void fail_timeout(const Op& op, const Deadline& deadline);

  int rank_;
  int size_;
  ShmSettings settings_;
  shm::Segment home_;              // our segment
  shm::Header* header_ = nullptr;  // home_'s header while mapped; null once closed
  std::mutex life_mu_;             // wake() against close()
  std::atomic<uint64_t> wakes_{0};
  int local_ = -1;                            // our index among the local ranks
  std::vector<std::unique_ptr<Peer>> peers_;  // by global rank; null for other hosts
  ViewPool bounce_;                           // views of messages that are not one inline slot
  TransportStats stats_;
  bool eager_ = true;
  bool aborted_ = false;
  int peers_reused_ = 0;
  // 1 for memory made for this communicator; one more for each shrink that
  // took it over (shm_reuse.cc). What this transport writes into the aborted
  // and closed flags, and the least value of theirs it reads as gone.
  uint32_t generation_ = 1;
  bool bulletin_ok_ = false;         // every rank of the communicator is local
  bool bulletin_all_[2] = {false, false};  // whether every peer reads our bulletin[i]
};

}  // namespace rr
