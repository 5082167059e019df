#include "transport/shm/shm_window.h"

#include <string>

#include "common/error.h"

namespace rr {

size_t SharedWindow::data_offset() { return shm::round_up(sizeof(shm::Header), 4096); }

std::shared_ptr<SharedWindow> SharedWindow::create(uint64_t id, size_t bytes, int rank, int size) {
  auto w = std::make_shared<SharedWindow>(id);
  w->bytes_ = bytes;
  w->own_ = shm::Segment::create(data_offset() + bytes);
  w->own_.reserve(data_offset(), bytes,
                  "for window " + std::to_string(id) + " of rank " + std::to_string(rank));
  w->peers_.resize(static_cast<size_t>(size));
  return w;
}

void SharedWindow::attach(int peer, const shm::SegmentRecord& record) {
  if (record.bytes < data_offset()) {
    throw Error("shared memory: rank " + std::to_string(peer) + " published window " +
                std::to_string(id()) + " of " + std::to_string(record.bytes) +
                " bytes, less than its header");
  }
  shm::Segment s = shm::Segment::attach(record, record.bytes, peer);
  // Its owner reserved every page when it made it: we write into reserved
  // pages only, and need no fd to reserve more.
  s.close_fd();
  peers_.at(static_cast<size_t>(peer)) = std::move(s);
}

char* SharedWindow::peer_data(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) return nullptr;
  const shm::Segment& s = peers_[static_cast<size_t>(peer)];
  return s.mapped() ? s.base() + data_offset() : nullptr;
}

size_t SharedWindow::peer_bytes(int peer) const {
  if (peer_data(peer) == nullptr) return 0;
  return peers_[static_cast<size_t>(peer)].bytes() - data_offset();
}

void WindowRegistry::add(const std::shared_ptr<Window>& window) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = windows_.begin(); it != windows_.end();) {
    it = it->second.expired() ? windows_.erase(it) : std::next(it);
  }
  windows_[window->id()] = window;
  any_.store(true, std::memory_order_relaxed);
}

std::optional<WindowRegistry::Place> WindowRegistry::find(const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, weak] : windows_) {
    std::shared_ptr<Window> w = weak.lock();
    if (!w) continue;
    const auto start = reinterpret_cast<uintptr_t>(w->data());
    if (at >= start && at - start <= w->bytes() && bytes <= w->bytes() - (at - start)) {
      return Place{std::move(w), at - start};
    }
  }
  return std::nullopt;
}

std::shared_ptr<Window> WindowRegistry::get(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(id);
  return it == windows_.end() ? nullptr : it->second.lock();
}

}  // namespace rr
