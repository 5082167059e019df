// The memory ranks on one host share: each rank's *home* segment, mapped by
// every other rank of its host.
//
// A home segment holds the rank's doorbell (which its peers ring when they
// publish something for it) and one *inbox* per peer on the host: a ring of
// message slots that only that peer writes and only this rank reads.
//
//   Header | inbox[local 0] | inbox[local 1] | ... | inbox[local L-1]
//   inbox  = InboxControl | slot 0 | slot 1 | ... | slot S-1
//   slot   = SlotHeader | data (slot_bytes)
//
// A message occupies one slot, either with its bytes inline (copied in by the
// sender, read out by the receiver, or reduced straight from the slot), or,
// for large messages where the kernel allows it, as the address of the
// sender's own buffer, which the receiver copies with one process_vm_readv
// (cross-memory attach): one copy instead of two. An inline message larger
// than a slot takes several slots, in order, the last one marked.
//
// `head` (written by the sender) counts the messages published, `tail`
// (written by the receiver) those released; a slot is free once tail has
// passed it. Both are monotonic 64-bit counters, so they never wrap.
//
// The header also holds the owner's bulletin (transport/bulletin.h): two
// entries it writes and its peers read, and its phase counter.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/futex.h"

namespace rr {
namespace shm {

constexpr uint64_t kMagic = 0x3130484D53485252ull;  // "RRHSHM01"
// The layout of Header and the inboxes: segments of another version are refused.
constexpr uint32_t kLayoutVersion = 6;
// Ranks of one host that can share memory with each other.
constexpr int kMaxLocal = 1024;

enum class SlotMode : uint32_t {
  kInline = 1,  // the bytes follow the header
  kRemote = 2,  // `remote` is the address of the bytes in the sender's process
};

// One entry of the bulletin: `ready` is its number, stored after the body (and
// set to kBulletinWriting before the body is rewritten), so that a reader that
// finds the same number before and after copying the body has a whole one.
constexpr uint64_t kBulletinWriting = ~0ull;
struct alignas(64) BulletinEntry {
  std::atomic<uint64_t> ready;
  char body[120];
};
static_assert(sizeof(BulletinEntry) == 128, "two cache lines");

struct alignas(64) Header {
  uint64_t magic;
  // An address in the owner's process whose 8 bytes hold kMagic: peers probe
  // it with process_vm_readv to learn whether the kernel lets them read ours.
  uint64_t probe;
  int32_t pid;
  uint32_t local_size;
  uint32_t slots;
  uint32_t version;  // kLayoutVersion
  uint64_t slot_bytes;
  uint64_t inbox_bytes;
  // The segment's size and a random number drawn when it was made: both are
  // also published through the store, and a peer checks them before it
  // reads anything else (shm_segment.h).
  uint64_t bytes;
  uint64_t nonce;
  // Set when the owner gives up on the communicator after a failure, or
  // closes it, so that peers still waiting on it fail at once instead of at
  // their deadline. Each holds the generation of the owner's transport that
  // set it (1, and one more for each shrink that took the memory over): a
  // transport reads a value of its own generation or later as gone, so the
  // flags of the communicator a shrink replaced stay set for the ranks it
  // left out.
  std::atomic<uint32_t> aborted;
  std::atomic<uint32_t> closed;
  // The CPUs the owner may run on (its affinity mask, one bit per CPU, 1024
  // CPUs; cpus_known = 0 when it could not be read): the local ranks' union
  // says whether they have a core each (spin) or share cores (yield).
  uint32_t cpus_known;
  uint8_t cpus[128];
  alignas(64) Doorbell doorbell;
  // cma_from[l] = 1: the owner can read the memory of local rank l, so l may
  // send it large messages by address.
  alignas(64) std::atomic<uint8_t> cma_from[kMaxLocal];
  // The bulletin: entry n at bulletin[n % 2].
  BulletinEntry bulletin[2];
  // The owner's phase in a call that reads its peers' windows in place
  // (Bulletin::raise_phase), tagged with the generation of the transport that
  // wrote it (shm_bulletin.cc): only ever raised within one generation.
  alignas(64) std::atomic<uint64_t> phase;
};

struct alignas(64) InboxControl {
  alignas(64) std::atomic<uint64_t> head;  // messages published (sender)
  alignas(64) std::atomic<uint64_t> tail;  // messages released (receiver)
};

struct alignas(64) SlotHeader {
  uint64_t bytes;  // inline: bytes in this slot; remote: bytes of the message
  SlotMode mode;
  uint32_t last;  // inline: the message's last slot
  uint64_t remote;
};

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline size_t slot_stride(size_t slot_bytes) {
  return round_up(sizeof(SlotHeader) + slot_bytes, 64);
}

inline size_t inbox_bytes(size_t slots, size_t slot_bytes) {
  return sizeof(InboxControl) + slots * slot_stride(slot_bytes);
}

inline size_t segment_bytes(int local_size, size_t slots, size_t slot_bytes) {
  return round_up(sizeof(Header), 64) +
         static_cast<size_t>(local_size) * inbox_bytes(slots, slot_bytes);
}

// The inbox in `base` (a home segment) written by local rank `sender`.
inline InboxControl* inbox(char* base, int sender) {
  const auto* h = reinterpret_cast<const Header*>(base);
  return reinterpret_cast<InboxControl*>(base + round_up(sizeof(Header), 64) +
                                         static_cast<size_t>(sender) * h->inbox_bytes);
}

inline SlotHeader* slot(InboxControl* box, const Header& h, uint64_t index) {
  char* first = reinterpret_cast<char*>(box) + sizeof(InboxControl);
  return reinterpret_cast<SlotHeader*>(first + (index % h.slots) * slot_stride(h.slot_bytes));
}

inline char* slot_data(SlotHeader* s) { return reinterpret_cast<char*>(s) + sizeof(SlotHeader); }

}  // namespace shm
}  // namespace rr
