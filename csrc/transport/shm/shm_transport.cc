#include "transport/shm/shm_transport.h"

#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "transport/shm/shm_peer.h"

namespace rr {

namespace shm {

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

bool read_remote(pid_t pid, void* local, uint64_t remote, size_t bytes) {
  char* out = static_cast<char*>(local);
  size_t done = 0;
  while (done < bytes) {
    iovec l{out + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

namespace {

constexpr size_t kPage = 4096;

}  // namespace

}  // namespace shm

using shm::kPage;
using shm::pidfd_open;
using shm::rank_name;
using shm::read_remote;
using shm::ring_neighbour;

ShmTransport::ShmTransport(int rank, int size, const ShmSettings& settings)
    : rank_(rank), size_(size), settings_(settings) {
  peers_.resize(static_cast<size_t>(size));
}

ShmTransport::~ShmTransport() { close(); }

std::unique_ptr<ShmTransport> ShmTransport::connect(Store& store, const std::string& prefix,
                                                    int rank, int size,
                                                    const std::vector<int>& local_ranks,
                                                    const ShmSettings& settings,
                                                    const Deadline& deadline,
                                                    const ShmReuse* reuse) {
  const int local_size = static_cast<int>(local_ranks.size());
  if (local_size > shm::kMaxLocal) {
    throw Error("shared memory: " + std::to_string(local_size) + " ranks on one host, more than " +
                std::to_string(shm::kMaxLocal));
  }
  if (reuse != nullptr) {
    // Taken over only when every local rank can hand its memory over: each says
    // whether it can, and all decide alike from the same answers.
    std::vector<int> olds;
    for (int r : local_ranks) olds.push_back(reuse->old_ranks.at(static_cast<size_t>(r)));
    bool all = reuse->parent != nullptr && reuse->parent->can_hand_over(olds);
    store.set(prefix + "shm_parked/" + std::to_string(rank), all ? "1" : "0");
    for (const std::string& can :
         get_of_ranks(store, prefix + "shm_parked/", local_ranks, rank, deadline)) {
      all = can == "1" && all;
    }
    if (all) {
      return take_over(*reuse->parent, store, prefix, rank, size, local_ranks, reuse->old_ranks,
                       settings, deadline);
    }
  }
  std::unique_ptr<ShmTransport> t(new ShmTransport(rank, size, settings));
  t->local_ = static_cast<int>(std::find(local_ranks.begin(), local_ranks.end(), rank) -
                               local_ranks.begin());
  // Peers read our memory for large messages; under Yama ptrace_scope 1 that
  // needs our consent (as Open MPI's CMA support asks for it too).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

  const size_t bytes = shm::segment_bytes(local_size, settings.slots, settings.slot_bytes);
  t->home_ = shm::Segment::create(bytes);
  t->header_ = t->home_.header();
  t->header_->probe = reinterpret_cast<uint64_t>(&t->header_->magic);
  t->header_->local_size = static_cast<uint32_t>(local_size);
  t->header_->slots = static_cast<uint32_t>(settings.slots);
  t->header_->slot_bytes = settings.slot_bytes;
  t->header_->inbox_bytes = shm::inbox_bytes(settings.slots, settings.slot_bytes);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) == 0) {
    static_assert(sizeof mine >= sizeof t->header_->cpus, "cpu_set_t holds 1024 CPUs");
    std::memcpy(t->header_->cpus, &mine, sizeof t->header_->cpus);
    t->header_->cpus_known = 1;
  }

  // The inboxes' counters, which we and each sender write; the slots are the senders'.
  for (int l = 0; l < local_size; ++l) {
    if (l == t->local_) continue;
    const char* box = reinterpret_cast<char*>(shm::inbox(t->home_.base(), l));
    t->home_.reserve(static_cast<size_t>(box - t->home_.base()), sizeof(shm::InboxControl),
                     "for this rank's segment");
  }
  store.set(prefix + "shm/" + std::to_string(rank), t->home_.record().encode());
  const std::vector<std::string> records =
      get_of_ranks(store, prefix + "shm/", local_ranks, rank, deadline);
  for (int l = 0, next = 0; l < local_size; ++l) {
    const int r = local_ranks[static_cast<size_t>(l)];
    if (r == rank) continue;
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->local = l;
    const shm::SegmentRecord record =
        shm::SegmentRecord::decode(records[static_cast<size_t>(next++)], r);
    p->pid = record.pid;
    // Checked before it is mapped, and its header before anything else is read.
    p->segment = shm::Segment::attach(record, bytes, r);
    p->header = p->segment.header();
    if (p->header->local_size != t->header_->local_size || p->header->slots != t->header_->slots ||
        p->header->slot_bytes != t->header_->slot_bytes ||
        p->header->inbox_bytes != t->header_->inbox_bytes) {
      throw Error("shared memory: the segment of " + rank_name(r) +
                  " has another layout (a different ringreduce version or settings)");
    }
    p->out = shm::inbox(p->segment.base(), t->local_);
    p->in = shm::inbox(t->home_.base(), l);
    p->consumed.assign(settings.slots, 0);
    // Our inbox in its segment takes memory as we first write each slot; a ring
    // neighbour's is reserved whole now, so a ring never reserves mid-call.
    p->reserved.assign(settings.slots, 0);
    if (ring_neighbour(rank, size, local_ranks, l, t->local_)) t->reserve_inbox(*p);
    p->pidfd = Fd(pidfd_open(p->pid));
    // Can we read its memory? Then it may send us large messages by address.
    uint64_t probe = 0;
    if (read_remote(p->pid, &probe, p->header->probe, sizeof probe) && probe == shm::kMagic) {
      t->header_->cma_from[l].store(1, std::memory_order_release);
    }
    t->peers_[static_cast<size_t>(r)] = std::move(p);
  }
  // Once every peer has mapped our segment and set its flags, the fd has
  // done its job; from here on the memory lives as long as a mapping.
  store.set(prefix + "shm_ready/" + std::to_string(rank), "1");
  get_of_ranks(store, prefix + "shm_ready/", local_ranks, rank, deadline);
  t->home_.close_fd();
  for (auto& p : t->peers_) {
    if (p) p->segment.keep_fd_only_if_needed();  // later reservations go through the mapping
  }
  t->bulletin_ok_ = local_size == size;
  t->decide_waits();
  for (auto& p : t->peers_) {
    if (p) p->by_address = p->header->cma_from[t->local_].load(std::memory_order_acquire) != 0;
  }
  return t;
}

// Spin while waiting when the local ranks have a core each, counted over the
// union of their affinity masks (ranks bound one per core each see one CPU);
// yield when they share cores, since the rank we wait for may be runnable on
// ours. Every peer wrote its mask before it published its segment.
void ShmTransport::decide_waits() {
  int local_size = 1;
  for (const auto& p : peers_) local_size += p ? 1 : 0;
  bool known = header_->cpus_known != 0;
  uint8_t all[sizeof header_->cpus];
  std::memcpy(all, header_->cpus, sizeof all);
  for (const auto& p : peers_) {
    if (!p) continue;
    known = known && p->header->cpus_known != 0;
    for (size_t i = 0; i < sizeof all; ++i) all[i] |= p->header->cpus[i];
  }
  int cpus = 0;
  for (uint8_t byte : all) cpus += __builtin_popcount(byte);
  if (known && local_size > cpus) settings_.oversubscribed = true;
  if (settings_.log) {
    std::fprintf(stderr,
                 "ringreduce rank %d: shared memory: %d local rank(s) on %s CPU(s): waits %s\n",
                 rank_, local_size, known ? std::to_string(cpus).c_str() : "an unknown number of",
                 settings_.oversubscribed ? "yield" : "spin");
  }
}

ShmTransport::Peer& ShmTransport::peer(int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= peers_.size() ||
      !peers_[static_cast<size_t>(rank)]) {
    throw Error("shared memory: rank " + std::to_string(rank_) +
                " has no shared memory with rank " + std::to_string(rank) +
                " (another host, or not a rank of this communicator)");
  }
  return *peers_[static_cast<size_t>(rank)];
}

bool ShmTransport::reaches(int peer) const {
  return peer >= 0 && static_cast<size_t>(peer) < peers_.size() &&
         peers_[static_cast<size_t>(peer)] != nullptr;
}

bool ShmTransport::single_copy_to(int rank) const {
  return reaches(rank) && peers_[static_cast<size_t>(rank)]->by_address;
}

RequestPtr ShmTransport::isend(int to, const void* data, size_t bytes) {
  auto op = std::make_shared<Op>(to, static_cast<char*>(const_cast<void*>(data)), bytes, true);
  if (bytes == 0) {
    op->done_ = true;
    return op;
  }
  Peer& p = peer(to);
  p.sends.push_back(op);
  progress_sends(p);
  return op;
}

RequestPtr ShmTransport::irecv(int from, void* data, size_t bytes) {
  return post_recv(std::make_shared<Op>(from, static_cast<char*>(data), bytes, false));
}

RequestPtr ShmTransport::irecv_view(int from, size_t bytes) {
  auto op = std::make_shared<Op>(from, nullptr, bytes, false);
  op->is_view = true;
  return post_recv(std::move(op));
}

RequestPtr ShmTransport::post_recv(std::shared_ptr<Op> op) {
  if (op->bytes == 0) {
    op->done_ = true;
    return op;
  }
  Peer& p = peer(op->peer_);
  p.recvs.push_back(op);
  progress_recvs(p);
  return op;
}

void ShmTransport::release(Request& view) {
  auto& op = static_cast<Op&>(view);
  if (!op.is_view || !op.done_) return;
  if (op.holds_slot) {
    op.holds_slot = false;
    if (settings_.poison_released) std::memset(const_cast<char*>(op.view_ptr), 0x5A, op.bytes);
    consume(peer(op.peer_), op.slot_index);
  } else if (op.bounce) {
    bounce_.give_back(std::move(op.bounce));
  }
  op.view_ptr = nullptr;
}

MemoryRange ShmTransport::view_region(int from, size_t bytes) {
  if (!reaches(from) || header_ == nullptr || bytes == 0 || bytes > header_->slot_bytes) return {};
  const Peer& p = *peers_[static_cast<size_t>(from)];
  // It sends messages this large by address when we can read its memory, with
  // its settings, which are ours (a peer whose differ still gives right views,
  // copies where the range said in place).
  if (header_->cma_from[p.local].load(std::memory_order_acquire) != 0 &&
      bytes >= settings_.cma_min_bytes) {
    return {};
  }
  // The whole home segment, not p's inbox alone: whole pages, one range for
  // every peer's inbox (inboxes share pages at their edges, which a device
  // could not lock twice).
  return {home_.base(), home_.bytes()};
}

MemoryRange ShmTransport::lend_region(int to) {
  if (!reaches(to) || header_ == nullptr) return {};
  const Peer& p = *peers_[static_cast<size_t>(to)];
  return {p.segment.base(), p.segment.bytes()};
}

char* ShmTransport::lend(int to, size_t bytes) {
  if (!reaches(to) || header_ == nullptr || bytes == 0) return nullptr;
  Peer& p = *peers_[static_cast<size_t>(to)];
  const shm::Header& h = *p.header;
  if (!p.sends.empty() || bytes > h.slot_bytes) return nullptr;
  if (p.out_head - p.out->tail.load(std::memory_order_acquire) >= h.slots) return nullptr;
  shm::SlotHeader* s = shm::slot(p.out, h, p.out_head);
  const size_t need = sizeof(shm::SlotHeader) + bytes;
  if (need > p.reserved[p.out_head % p.reserved.size()]) reserve_slot(p, s, p.out_head, need);
  char* data = shm::slot_data(s);
  // Tests: what was lent holds garbage until the caller fills it.
  if (settings_.poison_released) std::memset(data, 0x3C, bytes);
  p.lent.push_back({p.out_head, data});
  ++p.out_head;
  return data;
}

RequestPtr ShmTransport::isend_lent(int to, char* lent, size_t bytes) {
  Peer& p = peer(to);
  if (p.lent.empty() || p.lent.front().data != lent) {
    throw Error("shared memory: rank " + std::to_string(rank_) + " posted memory lent for rank " +
                std::to_string(to) + " out of the order it was lent in");
  }
  shm::SlotHeader* s = shm::slot(p.out, *p.header, p.lent.front().index);
  s->bytes = bytes;
  s->mode = shm::SlotMode::kInline;
  s->last = 1;
  s->remote = 0;
  p.lent.pop_front();
  publish(p);
  p.header->doorbell.ring();
  ++p.moved;
  stats_.bytes_sent += bytes;
  auto op = std::make_shared<Op>(to, lent, bytes, true);
  op->done_ = true;  // published: nothing of ours is left to read
  // Queued sends may have waited behind it.
  progress_sends(p);
  return op;
}

void ShmTransport::publish(Peer& p) {
  const uint64_t head = p.lent.empty() ? p.out_head : p.lent.front().index;
  p.out->head.store(head, std::memory_order_release);
}

std::string ShmTransport::in_segment_of(const Peer& p) const {
  return "in the segment of " + rank_name(p.rank) + " for " + rank_name(rank_) + "'s messages";
}

void ShmTransport::reserve_inbox(Peer& p) {
  const size_t at = static_cast<size_t>(reinterpret_cast<char*>(p.out) - p.segment.base());
  p.segment.reserve(at, p.header->inbox_bytes, in_segment_of(p));
  std::fill(p.reserved.begin(), p.reserved.end(), shm::slot_stride(p.header->slot_bytes));
}

void ShmTransport::reserve_slot(Peer& p, shm::SlotHeader* s, uint64_t index, size_t need) {
  // A message of a page or less reserves the slot's first page's worth; a
  // larger one, the whole slot, once.
  const size_t stride = shm::slot_stride(p.header->slot_bytes);
  const size_t want = std::min(need <= kPage ? kPage : stride, stride);
  const size_t at = static_cast<size_t>(reinterpret_cast<char*>(s) - p.segment.base());
  p.segment.reserve(at, want, in_segment_of(p));
  p.reserved[index % p.reserved.size()] = want;
}

// Publishes what fits of the queued sends to `p`, and completes the sends by
// address that `p` has read.
bool ShmTransport::progress_sends(Peer& p) {
  bool moved = false;
  const shm::Header& h = *p.header;
  uint64_t tail = p.out->tail.load(std::memory_order_acquire);
  while (!p.by_address_sent.empty() && p.by_address_sent.front()->index < tail) {
    p.by_address_sent.front()->done_ = true;
    stats_.bytes_sent += p.by_address_sent.front()->bytes;
    p.by_address_sent.pop_front();
    moved = true;
  }
  bool published = false;
  while (!p.sends.empty() && p.out_head - tail < h.slots) {
    Op& op = *p.sends.front();
    shm::SlotHeader* s = shm::slot(p.out, h, p.out_head);
    const bool by_address = p.by_address && op.bytes >= settings_.cma_min_bytes;
    const size_t need = sizeof(shm::SlotHeader) +
                        (by_address ? 0 : std::min<size_t>(h.slot_bytes, op.bytes - op.moved));
    if (need > p.reserved[p.out_head % p.reserved.size()]) reserve_slot(p, s, p.out_head, need);
    if (by_address) {
      s->bytes = op.bytes;
      s->mode = shm::SlotMode::kRemote;
      s->last = 1;
      s->remote = reinterpret_cast<uint64_t>(op.data);
      op.index = p.out_head;
      p.by_address_sent.push_back(std::move(p.sends.front()));
      p.sends.pop_front();
    } else {
      const size_t len = std::min<size_t>(h.slot_bytes, op.bytes - op.moved);
      std::memcpy(shm::slot_data(s), op.data + op.moved, len);
      op.moved += len;
      s->bytes = len;
      s->mode = shm::SlotMode::kInline;
      s->last = op.moved == op.bytes ? 1 : 0;
      s->remote = 0;
      if (s->last) {
        op.done_ = true;
        stats_.bytes_sent += op.bytes;
        p.sends.pop_front();
      }
    }
    ++p.out_head;
    publish(p);
    published = moved = true;
    if (p.out_head - tail >= h.slots) tail = p.out->tail.load(std::memory_order_acquire);
  }
  if (published) p.header->doorbell.ring();
  if (moved) ++p.moved;
  return moved;
}

// Takes the messages that have arrived from `p` into the posted receives.
bool ShmTransport::progress_recvs(Peer& p) {
  bool moved = false;
  while (!p.recvs.empty()) {
    const uint64_t head = p.in->head.load(std::memory_order_acquire);
    if (p.in_next >= head) break;
    Op& op = *p.recvs.front();
    shm::SlotHeader* s = shm::slot(p.in, *header_, p.in_next);
    const uint64_t index = p.in_next++;
    moved = true;
    if (s->mode == shm::SlotMode::kRemote) {
      if (s->bytes != op.bytes) {
        throw Error("shared memory: " + rank_name(p.rank) + " sent a message of " +
                    std::to_string(s->bytes) + " bytes where " + rank_name(rank_) + " expected " +
                    std::to_string(op.bytes) + " (the ranks cut a step differently)");
      }
      char* dst = op.data;
      if (op.is_view) {
        op.bounce = bounce_.take(op.bytes);
        dst = op.bounce->data();
        op.view_ptr = dst;
      }
      if (!read_remote(p.pid, dst, s->remote, op.bytes)) {
        const int err = errno;
        throw PeerError(errno_message("shared memory: cannot read the message of " +
                                          rank_name(p.rank) + " from its memory",
                                      err),
                        p.rank);
      }
      consume(p, index);
    } else if (op.is_view && op.moved == 0 && s->last && s->bytes == op.bytes) {
      // The whole message in one slot: the view is the slot itself.
      op.view_ptr = shm::slot_data(s);
      op.holds_slot = true;
      op.slot_index = index;
    } else {
      if (op.moved + s->bytes > op.bytes || (s->last && op.moved + s->bytes != op.bytes)) {
        throw Error("shared memory: " + rank_name(p.rank) +
                    " sent a message that does not match the " + std::to_string(op.bytes) +
                    " bytes " + rank_name(rank_) + " expected (the ranks cut a step differently)");
      }
      char* dst = op.data;
      if (op.is_view) {
        if (!op.bounce) op.bounce = bounce_.take(op.bytes);
        dst = op.bounce->data();
        op.view_ptr = dst;
      }
      // Read the slot's fields before handing it back: once consumed, the sender
      // may reuse it at once.
      const bool last = s->last != 0;
      std::memcpy(dst + op.moved, shm::slot_data(s), s->bytes);
      op.moved += s->bytes;
      consume(p, index);
      if (!last) continue;
    }
    op.done_ = true;
    stats_.bytes_received += op.bytes;
    p.recvs.pop_front();
  }
  if (moved) ++p.moved;
  return moved;
}

// Marks message `index` of p's inbox as done with, and releases every slot
// up to the first still held (by a view), so that p may reuse them.
void ShmTransport::consume(Peer& p, uint64_t index) {
  p.consumed[index % p.consumed.size()] = 1;
  const uint64_t before = p.in_tail;
  while (p.in_tail < p.in_next && p.consumed[p.in_tail % p.consumed.size()]) {
    p.consumed[p.in_tail % p.consumed.size()] = 0;
    ++p.in_tail;
  }
  if (p.in_tail != before) {
    p.in->tail.store(p.in_tail, std::memory_order_release);
    p.header->doorbell.ring();  // it may wait for room, or for a send by address
  }
}

bool ShmTransport::progress() {
  bool moved = false;
  for (auto& p : peers_) {
    if (!p) continue;
    moved |= progress_recvs(*p);
    moved |= progress_sends(*p);
  }
  return moved;
}

void ShmTransport::abort() noexcept {
  std::lock_guard<std::mutex> lock(life_mu_);
  if (aborted_ || header_ == nullptr) return;
  aborted_ = true;
  // Peers waiting on us fail now rather than at their deadline; they look
  // at the flag whenever a wait of theirs sleeps or spins long.
  header_->aborted.store(generation_, std::memory_order_release);
  for (auto& p : peers_) {
    if (p) {
      p->header->doorbell.ring();
      // Sends by address point into the caller's buffers, which stay the caller's.
      p->sends.clear();
      p->by_address_sent.clear();
      p->recvs.clear();
      p->lent.clear();
    }
  }
}

bool ShmTransport::can_hand_over(const std::vector<int>& old) const {
  if (!aborted_ || header_ == nullptr) return false;
  for (int r : old) {
    if (r == rank_) continue;
    if (r < 0 || static_cast<size_t>(r) >= peers_.size() || !peers_[static_cast<size_t>(r)]) {
      return false;
    }
  }
  return true;
}

// Safe to call from several threads, and more than once: the first caller
// unmaps, under the lock wake() reads the header with. The caller makes sure
// that no thread is inside a wait or progress() on this transport (the
// communicator joins its threads first; a failing thread aborts its own).
void ShmTransport::close() noexcept {
  std::lock_guard<std::mutex> lock(life_mu_);
  if (header_ != nullptr) {
    // A peer still waiting on us (it went on while we stopped) learns it now.
    header_->closed.store(generation_, std::memory_order_release);
    for (auto& p : peers_) {
      if (p) p->header->doorbell.ring();
    }
  }
  // Sends by address point into the caller's buffers, which stay the
  // caller's: forget them (after a normal end nothing is queued), and give
  // the shared memory back now rather than when the communicator is
  // collected: it goes away with the last mapping.
  for (auto& p : peers_) {
    if (!p) continue;
    p->sends.clear();
    p->by_address_sent.clear();
    p->recvs.clear();
    p->lent.clear();
    p->segment.unmap();
  }
  peers_.clear();
  header_ = nullptr;
  home_.unmap();
}

}  // namespace rr
