// Waiting on the shared-memory transport: spinning, sleeping on the
// doorbell, renewing the deadline on progress, and naming a peer that died,
// gave up or closed (see shm_transport.h).
#include <poll.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>

#include "common/error.h"
#include "transport/shm/shm_peer.h"
#include "transport/shm/shm_transport.h"
#include "transport/waiter.h"

namespace rr {

using shm::rank_name;

namespace {

// How long one sleep on the doorbell lasts at most: also how often a wait
// looks at whether the awaited peer is still alive.
constexpr std::chrono::microseconds kSleepSlice = kLivenessSlice;
// While spinning, the clock is read every kRoundsPerLook rounds of looking
// for messages, and the awaited peer's liveness every kSpinsPerLivenessCheck.
constexpr unsigned kRoundsPerLook = 32;
// A wait in the background spins this long at most (set_eager(false)).
constexpr std::chrono::microseconds kPoliteSpin{2};
constexpr unsigned kSpinsPerLivenessCheck = 32 * 1024;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace

// One round of waiting without sleeping: a spin of the CPU when every rank of
// the host has a core of its own; with more ranks than cores, a yield, since
// the peer we wait for may be runnable on this very core.
std::chrono::microseconds ShmTransport::spin() const {
  return eager_ ? settings_.spin : std::min(settings_.spin, kPoliteSpin);
}

void ShmTransport::pause() const {
  if (settings_.oversubscribed) {
    sched_yield();
  } else {
    cpu_relax();
  }
}

void ShmTransport::wake() {
  wakes_.fetch_add(1);
  // Any thread may wake us, also while another closes: the header is read
  // under the lock that close() takes to unmap it.
  std::lock_guard<std::mutex> lock(life_mu_);
  if (header_ != nullptr) header_->doorbell.ring();
}

uint64_t ShmTransport::moved(int peer, bool) const {
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size() || !peers_[peer]) return 0;
  return peers_[static_cast<size_t>(peer)]->moved;
}

void ShmTransport::check_peer(Peer& p, const Op& op) {
  const Gone gone = peer_gone(p);
  if (gone == Gone::kNo) return;
  // What it published before it went is in our memory: take it first.
  progress();
  if (op.done_) return;
  blame(p, gone);
}

ShmTransport::Gone ShmTransport::peer_gone(Peer& p) const {
  if (p.header->aborted.load(std::memory_order_acquire) >= generation_) return Gone::kAborted;
  bool dead = false;
  if (p.pidfd.valid()) {
    pollfd fd{p.pidfd.get(), POLLIN, 0};
    dead = ::poll(&fd, 1, 0) > 0;
  } else {
    dead = ::kill(p.pid, 0) != 0 && errno == ESRCH;
  }
  if (dead) return Gone::kDead;
  if (p.header->closed.load(std::memory_order_acquire) >= generation_) return Gone::kClosed;
  return Gone::kNo;
}

// What we learned of the peer; the waiter adds what we were waiting for.
void ShmTransport::blame(Peer& p, Gone gone) const {
  if (gone == Gone::kAborted) {
    throw PeerError(rank_name(p.rank) + " gave up on the communicator (it failed)", p.rank);
  }
  if (gone == Gone::kDead) {
    throw PeerError(rank_name(p.rank) + " (pid " + std::to_string(p.pid) +
                        " on this host) exited, crashed or was killed",
                    p.rank);
  }
  throw PeerError(rank_name(p.rank) + " closed its communicator", p.rank);
}

// The waiter's view of one wait: progress is a message moved to or from the
// awaited peer; the peer is looked at through its pidfd and the flags in its
// segment; sleeping is on our doorbell, which peers ring when they publish.
struct ShmTransport::Waiting final : Waitable {
  Waiting(ShmTransport& t, Op& op) : t(t), op(op), awaited(t.peer(op.peer_)) {}
  bool done() const override { return op.done_; }
  uint32_t arm() override { return t.header_->doorbell.read(); }
  void progress() override { t.progress(); }
  uint64_t moved() const override { return awaited.moved; }
  void check_peer() override { t.check_peer(awaited, op); }
  void pause() override { t.pause(); }
  void block(uint32_t armed, std::chrono::microseconds bound) override {
    t.header_->doorbell.sleep(armed, bound);
  }
  void timed_out(const Deadline& window) override { t.fail_timeout(op, window); }
  bool woken() const override { return t.wakes_.load() != wakes; }
  WaitContext context() const override { return {t.rank_, op.what(), t.name()}; }

  ShmTransport& t;
  Op& op;
  Peer& awaited;
  const uint64_t wakes = t.wakes_.load();
};

WaitPolicy ShmTransport::wait_policy() const {
  WaitPolicy policy;
  policy.spin = spin();
  policy.rounds_per_look = kRoundsPerLook;
  policy.looks_per_check = kSpinsPerLivenessCheck / kRoundsPerLook;
  policy.max_sleep = kSleepSlice;
  return policy;
}

void ShmTransport::wait(Request& request, const Deadline& deadline) {
  auto& op = static_cast<Op&>(request);
  if (op.done_) return;
  Waiting waiting(*this, op);
  wait_until_done(waiting, deadline, wait_policy());
}

bool ShmTransport::wait_for(Request& request, std::chrono::microseconds slice) {
  auto& op = static_cast<Op&>(request);
  if (op.done_) return true;
  Waiting waiting(*this, op);
  return wait_slice(waiting, slice, wait_policy());
}

void ShmTransport::fail_timeout(const Op& op, const Deadline& deadline) {
  throw_no_progress(deadline, op.what(), name(), op.peer_);
}

}  // namespace rr
