// The shared-memory bulletin (transport/bulletin.h): entries in each rank's
// home segment (shm_layout.h) that its peers read in place.
//
// Waiting on the bulletin is waiting as wait() does (transport/waiter.h):
// spin, then sleep on our doorbell, with the deadline, Ctrl-C and the awaited
// peer's liveness looked at. A publisher rings a peer's doorbell only when
// that peer sleeps (Doorbell::ring_if_sleeping), so a call nobody sleeps
// through writes nothing but its own entry.
#include <atomic>
#include <cstring>
#include <functional>
#include <string>

#include "common/error.h"
#include "transport/shm/shm_peer.h"
#include "transport/shm/shm_transport.h"
#include "transport/waiter.h"

namespace rr {

using shm::rank_name;

namespace {

// One wait on the bulletin as the waiter sees it (transport/waiter.h).
template <class Ready>
struct BulletinWaiting final : Waitable {
  BulletinWaiting(shm::Header& home, const uint64_t& moved_count, const Ready& ready)
      : home(home), moved_count(moved_count), ready(ready) {}
  bool done() const override { return ready(); }
  uint32_t arm() override { return home.doorbell.read(); }
  void progress() override { progress_fn(); }
  uint64_t moved() const override { return moved_count; }
  void check_peer() override { check_fn(); }
  void pause() override { pause_fn(); }
  void block(uint32_t armed, std::chrono::microseconds bound) override {
    home.doorbell.sleep_unless(armed, bound, ready);
  }
  void timed_out(const Deadline&) override { expire_fn(); }
  WaitContext context() const override { return waiting; }

  shm::Header& home;
  const uint64_t& moved_count;
  const Ready& ready;
  std::function<void()> progress_fn, check_fn, pause_fn, expire_fn;
  WaitContext waiting;
};

}  // namespace

template <class Ready>
void ShmTransport::bulletin_wait(Peer& awaited, const Ready& ready, const std::string& what,
                             const Deadline& deadline) {
  if (header_ == nullptr) throw Error("shared memory: " + rank_name(rank_) + " is closed");
  BulletinWaiting<Ready> w(*header_, awaited.moved, ready);
  w.waiting = {rank_, "waiting for " + what, name()};
  w.progress_fn = [this] { progress(); };
  w.pause_fn = [this] { pause(); };
  w.check_fn = [this, &awaited, &ready] {
    const Gone gone = peer_gone(awaited);
    if (gone == Gone::kNo) return;
    progress();  // what it did before it went still counts
    if (ready()) return;
    blame(awaited, gone);
  };
  w.expire_fn = [this, &awaited, &what, &deadline] {
    throw_no_progress(deadline, "waiting for " + what, name(), awaited.rank);
  };
  WaitPolicy policy;
  policy.spin = spin();
  policy.rounds_per_look = 32;
  policy.looks_per_check = 1024;
  wait_until_done(w, deadline, policy);
}

void ShmTransport::publish(uint64_t n, const void* body, size_t bytes, bool read_by_all,
                           const Deadline& deadline) {
  if (bytes > kEntryBytes) throw Error("shared memory: a bulletin entry holds at most 120 bytes");
  if (header_ == nullptr) throw Error("shared memory: " + rank_name(rank_) + " is closed");
  const size_t place = n % 2;
  if (n > 2) {
    // Entry n - 2's readers must be done with it before it is replaced. A rank
    // is done with our entry m once it has published its own entry m + 1: it
    // publishes that at the start of call m + 1, after call m, which read our
    // entry m if it was to.
    const uint64_t needed = n - 1;
    const int right = (rank_ + 1) % size_;
    for (auto& p : peers_) {
      if (!p || (!bulletin_all_[place] && p->rank != right)) continue;
      if (latest_entry(*p) >= needed) continue;
      Peer& reader = *p;
      bulletin_wait(
          reader, [&] { return latest_entry(reader) >= needed; },
          "rank " + std::to_string(reader.rank) + " to start call #" + std::to_string(needed) +
              " (it had not read entry " + std::to_string(n - 2) + " of rank " +
              std::to_string(rank_) + "'s bulletin)",
          deadline);
    }
  }
  shm::BulletinEntry& e = header_->bulletin[place];
  e.ready.store(shm::kBulletinWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(e.body, body, bytes);
  // Sequentially consistent: against a reader's sleepers count (ring_if_sleeping).
  e.ready.store(n, std::memory_order_seq_cst);
  bulletin_all_[place] = read_by_all;
  // Its readers may sleep on it, and so may a publisher waiting for our entry
  // to replace one of its own.
  for (auto& p : peers_) {
    if (p) p->header->doorbell.ring_if_sleeping();
  }
}

uint64_t ShmTransport::latest_entry(const Peer& p) const {
  uint64_t latest = 0;
  for (const shm::BulletinEntry& e : p.header->bulletin) {
    const uint64_t r = e.ready.load(std::memory_order_acquire);
    if (r != shm::kBulletinWriting && r > latest) latest = r;
  }
  return latest;
}

uint64_t ShmTransport::read(int peer_rank, uint64_t n, void* out, size_t bytes,
                            const Deadline& deadline) {
  if (bytes > kEntryBytes) throw Error("shared memory: a bulletin entry holds at most 120 bytes");
  Peer& p = peer(peer_rank);
  shm::BulletinEntry& e = p.header->bulletin[n % 2];
  auto published = [&e, n] {
    const uint64_t r = e.ready.load(std::memory_order_acquire);
    return r >= n && r != shm::kBulletinWriting;
  };
  for (;;) {
    if (!published()) {
      bulletin_wait(p, published,
                "call #" + std::to_string(n) + " of rank " + std::to_string(peer_rank) +
                    " (entry " + std::to_string(n) + " of its bulletin)",
                deadline);
    }
    const uint64_t before = e.ready.load(std::memory_order_acquire);
    if (before == shm::kBulletinWriting || before < n) continue;
    std::memcpy(out, e.body, bytes);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.ready.load(std::memory_order_relaxed) == before) return before;
  }
}

namespace {

// A phase word: the value (40 bits), the generation of the transport that
// wrote it (shm_reuse.cc), and the refusal bit. A value of another generation
// reads as 0: a rank left out of a shrink, resumed, must not take the
// survivors' phases in their new communicator for its own call's.
constexpr int kValueBits = 40;
constexpr uint64_t kValueMask = (uint64_t{1} << kValueBits) - 1;

uint64_t phase_word(uint64_t value, uint32_t generation) {
  return (value & (Bulletin::kPhaseRefused | kValueMask)) |
         (static_cast<uint64_t>(generation & 0x7fffff) << kValueBits);
}

uint64_t phase_value(uint64_t word, uint32_t generation) {
  if (((word >> kValueBits) & 0x7fffff) != (generation & 0x7fffff)) return 0;
  return word & (Bulletin::kPhaseRefused | kValueMask);
}

}  // namespace

void ShmTransport::raise_phase(uint64_t value) {
  if (header_ == nullptr) throw Error("shared memory: " + rank_name(rank_) + " is closed");
  // Sequentially consistent: against a waiter's sleepers count, as publish().
  header_->phase.store(phase_word(value, generation_), std::memory_order_seq_cst);
  for (auto& p : peers_) {
    if (p) p->header->doorbell.ring_if_sleeping();
  }
}

uint64_t ShmTransport::phase_of(int peer_rank) {
  return phase_value(peer(peer_rank).header->phase.load(std::memory_order_acquire), generation_);
}

void ShmTransport::await_phase(int peer_rank, uint64_t value, const std::string& what,
                               const Deadline& deadline) {
  Peer& p = peer(peer_rank);
  const std::atomic<uint64_t>& word = p.header->phase;
  const uint32_t generation = generation_;
  auto reached = [&word, value, generation] {
    const uint64_t v = phase_value(word.load(std::memory_order_acquire), generation);
    return v >= value;  // a refusal has the top bit: reached too, and told below
  };
  if (!reached()) bulletin_wait(p, reached, what, deadline);
  if ((phase_value(word.load(std::memory_order_acquire), generation) & kPhaseRefused) != 0) {
    throw PeerError(rank_name(peer_rank) + " refused the call while " + rank_name(rank_) +
                        " was waiting for " + what,
                    peer_rank);
  }
}

}  // namespace rr
