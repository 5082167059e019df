// Host memory page-locked for a device's copies (cudaHostRegister), tracked
// for the whole process, so that every locked range is unlocked before its
// mapping goes away.
//
// Why a registry: the shared-memory transport owns the mappings a device
// copies from (its inboxes, whose slots a staged device call copies onto the
// GPU in place, executor/device_executor.h), and the device owns the locks.
// Neither outlives the other in a fixed order, and memory unmapped while
// locked stays pinned (and a later lock of whatever is mapped there fails).
// So the device locks through lock(), naming how to unlock, and whoever
// unmaps memory calls forget() first (shm::Segment does): the lock goes with
// the mapping, whichever object goes first.
#pragma once

#include <cstddef>

namespace rr {
namespace page_lock {

// Page-locks [p, p + bytes) for a device; true once it is. Returns false
// (and nothing is recorded) when it cannot, e.g. where the host has no
// memory for the pages.
using LockFn = bool (*)(void* p, size_t bytes);
// Undoes a LockFn's lock of the range starting at p. Must not throw: it runs
// on the way to munmap, whatever state the device is in.
using UnlockFn = void (*)(void* p) noexcept;

// Locks [p, p + bytes) with `lock` unless a range locked by the same kind of
// lock (`unlock`) already covers it. True when the range is locked.
bool lock(void* p, size_t bytes, LockFn lock, UnlockFn unlock);

// Whether [p, p + bytes) lies inside one range locked with `unlock`'s kind.
bool locked(const void* p, size_t bytes, UnlockFn unlock);

// Unlocks every locked range that starts inside [p, p + bytes): call it before
// unmapping them.
void forget(void* p, size_t bytes) noexcept;

// How many ranges are locked now (tests).
size_t count() noexcept;

}  // namespace page_lock
}  // namespace rr
