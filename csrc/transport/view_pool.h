// Buffers that a transport without memory of its own (a socket, MPI) lends
// out as views (Transport::irecv_view): a message is received into one, the
// algorithm reads it there, and release() puts it back for the next view.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace rr {

class ViewPool {
 public:
  using Slot = std::unique_ptr<std::vector<char>>;

  // A buffer of at least `bytes`, reused when one was given back.
  Slot take(size_t bytes) {
    Slot slot;
    if (spare_.empty()) {
      slot = std::make_unique<std::vector<char>>();
    } else {
      slot = std::move(spare_.back());
      spare_.pop_back();
    }
    if (slot->size() < bytes) slot->resize(bytes);
    return slot;
  }

  void give_back(Slot slot) { spare_.push_back(std::move(slot)); }

 private:
  std::vector<Slot> spare_;
};

}  // namespace rr
