#include "common/page_lock.h"

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace rr {
namespace page_lock {
namespace {

struct Range {
  size_t bytes;
  UnlockFn unlock;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Range> ranges;  // by start address; they never overlap
};

// Never destroyed: segments may be unmapped while static objects go away.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// The range that holds [at, at + bytes), or end().
std::map<uintptr_t, Range>::const_iterator holder(const Registry& r, uintptr_t at, size_t bytes) {
  auto it = r.ranges.upper_bound(at);
  if (it == r.ranges.begin()) return r.ranges.end();
  --it;
  return at + bytes <= it->first + it->second.bytes ? it : r.ranges.end();
}

}  // namespace

bool lock(void* p, size_t bytes, LockFn lock_fn, UnlockFn unlock) {
  if (p == nullptr || bytes == 0) return false;
  Registry& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto found = holder(r, at, bytes);
  if (found != r.ranges.end()) return found->second.unlock == unlock;
  // A range that overlaps one locked already (by another kind of lock, or
  // partly) is not locked twice.
  const auto next = r.ranges.lower_bound(at);
  if (next != r.ranges.end() && next->first < at + bytes) return false;
  if (next != r.ranges.begin()) {
    const auto before = std::prev(next);
    if (before->first + before->second.bytes > at) return false;
  }
  if (!lock_fn(p, bytes)) return false;
  r.ranges.emplace(at, Range{bytes, unlock});
  return true;
}

bool locked(const void* p, size_t bytes, UnlockFn unlock) {
  Registry& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  const auto found = holder(r, reinterpret_cast<uintptr_t>(p), bytes);
  return found != r.ranges.end() && found->second.unlock == unlock;
}

void forget(void* p, size_t bytes) noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = r.ranges.lower_bound(at);
  while (it != r.ranges.end() && it->first < at + bytes) {
    it->second.unlock(reinterpret_cast<void*>(it->first));
    it = r.ranges.erase(it);
  }
}

size_t count() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  return r.ranges.size();
}

}  // namespace page_lock
}  // namespace rr
