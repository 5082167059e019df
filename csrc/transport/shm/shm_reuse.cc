// A shrink's shared-memory transport taking over the memory of the revoked
// one (ShmTransport::connect's `reuse`): this rank's home segment and its
// mappings of the surviving local ranks' segments, with the inboxes between
// survivors kept where they are. The layout stays the old communicator's (an
// inbox per old local rank; the dead ranks' stay unused), so a peer's inbox
// is found by its old local index.
//
// What the revoked communicator left is dropped: each rank releases every
// message published into its inboxes (tail := head) and sends from where its
// own parked sends stopped (the head it left), and clears its bulletin. Its
// peers read none of these before the barrier at the end, which every rank
// passes only once all have done so. The aborted and closed flags hold the
// generation that set them, and each transport reads only its own generation
// and later ones as gone (shm_layout.h).
#include <algorithm>
#include <string>

#include "common/error.h"
#include "transport/shm/shm_peer.h"
#include "transport/shm/shm_transport.h"

namespace rr {

std::unique_ptr<ShmTransport> ShmTransport::take_over(ShmTransport& parent, Store& store,
                                                      const std::string& prefix, int rank, int size,
                                                      const std::vector<int>& local_ranks,
                                                      const std::vector<int>& old_ranks,
                                                      const ShmSettings& settings,
                                                      const Deadline& deadline) {
  std::unique_ptr<ShmTransport> t(new ShmTransport(rank, size, settings));
  const int me = static_cast<int>(std::find(local_ranks.begin(), local_ranks.end(), rank) -
                                  local_ranks.begin());
  const int local_size = static_cast<int>(local_ranks.size());
  {
    std::lock_guard<std::mutex> lock(parent.life_mu_);
    t->home_ = std::move(parent.home_);
    t->header_ = parent.header_;
    parent.header_ = nullptr;
    t->local_ = parent.local_;
    for (int l = 0; l < local_size; ++l) {
      const int r = local_ranks[static_cast<size_t>(l)];
      if (r == rank) continue;
      std::unique_ptr<Peer>& old =
          parent.peers_[static_cast<size_t>(old_ranks[static_cast<size_t>(r)])];
      std::unique_ptr<Peer> p = std::move(old);
      p->rank = r;  // its queues were emptied by the parent's abort()
      // Its messages to us that the revoked communicator never took: released.
      const uint64_t head = p->in->head.load(std::memory_order_acquire);
      p->in_next = head;
      p->in_tail = head;
      std::fill(p->consumed.begin(), p->consumed.end(), 0);
      p->in->tail.store(head, std::memory_order_release);
      // Our sends to it go on from where our parked ones stopped.
      p->out_head = p->out->head.load(std::memory_order_acquire);
      p->moved = 0;
      t->peers_[static_cast<size_t>(r)] = std::move(p);
      ++t->peers_reused_;
    }
  }
  // The flags keep saying that the old communicator's transports gave up (so a
  // rank left out of the shrink, resumed, still fails at once); ours count from
  // the next generation.
  t->generation_ = parent.generation_ + 1;
  for (shm::BulletinEntry& e : t->header_->bulletin) e.ready.store(0, std::memory_order_release);
  // A new ring neighbour's inbox is reserved whole now, as connect() does.
  for (int l = 0; l < local_size; ++l) {
    const int r = local_ranks[static_cast<size_t>(l)];
    if (r != rank && shm::ring_neighbour(rank, size, local_ranks, l, me)) {
      t->reserve_inbox(*t->peers_[static_cast<size_t>(r)]);
    }
  }
  store.set(prefix + "shm_ready/" + std::to_string(rank), "1");
  get_of_ranks(store, prefix + "shm_ready/", local_ranks, rank, deadline);
  t->bulletin_ok_ = local_size == size;
  t->decide_waits();
  return t;
}

}  // namespace rr
