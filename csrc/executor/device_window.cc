#include "executor/device_window.h"

#include <atomic>
#include <mutex>
#include <utility>

namespace rr {

namespace {

std::atomic<uint32_t>* flags(char* base) { return reinterpret_cast<std::atomic<uint32_t>*>(base); }

// Memory of windows whose arrays are gone, waiting for every peer to close its
// mapping (see the header).
struct Retired {
  std::shared_ptr<Device> device;
  char* data;
  std::shared_ptr<SharedWindow> control;  // our flags, which the peers raise
  int rank;
  int size;

  bool closed_by_all() const {
    std::atomic<uint32_t>* closed = flags(control->data());
    for (int r = 0; r < size; ++r) {
      if (r != rank && closed[r].load(std::memory_order_acquire) == 0) return false;
    }
    return true;
  }
};

std::mutex retired_mu;
std::vector<Retired>& retired() {
  static auto* list = new std::vector<Retired>();  // never destroyed: at exit, the driver frees
  return *list;
}

// Frees the retired memory that no peer maps any more.
void sweep() {
  std::lock_guard<std::mutex> lock(retired_mu);
  std::vector<Retired>& list = retired();
  for (auto it = list.begin(); it != list.end();) {
    if (it->closed_by_all()) {
      it->device->release_shared(it->data);
      it = list.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

DeviceWindow::DeviceWindow(uint64_t id, std::shared_ptr<Device> device, int device_id, size_t bytes,
                           int rank, int size, Device::SharedHandle* handle,
                           std::shared_ptr<SharedWindow> control)
    : Window(id),
      device_(std::move(device)),
      device_id_(device_id),
      bytes_(bytes),
      rank_(rank),
      peers_(static_cast<size_t>(size)),
      control_(std::move(control)) {
  sweep();
  data_ = static_cast<char*>(device_->allocate_shared(bytes, handle));
}

void DeviceWindow::close_peers() {
  for (size_t p = 0; p < peers_.size(); ++p) {
    Mapped& m = peers_[p];
    if (m.data != nullptr) device_->unmap_shared(m.data);
    m = {};
    char* theirs = control_ ? control_->peer_data(static_cast<int>(p)) : nullptr;
    if (theirs != nullptr) flags(theirs)[rank_].store(1, std::memory_order_release);
  }
}

DeviceWindow::~DeviceWindow() {
  close_peers();
  if (control_ == nullptr) {
    device_->release_shared(data_);
  } else {
    {
      std::lock_guard<std::mutex> lock(retired_mu);
      retired().push_back({device_, data_, control_, rank_, static_cast<int>(peers_.size())});
    }
    sweep();
  }
}

void DeviceWindow::map(int peer, const Device::SharedHandle& handle, size_t bytes,
                       int peer_device) {
  Mapped& m = peers_.at(static_cast<size_t>(peer));
  m.data = static_cast<char*>(device_->map_shared(handle, bytes, peer, peer_device));
  m.bytes = bytes;
}

void DeviceWindow::unshare(const std::string& why) {
  close_peers();
  unshared_ = why;
}

char* DeviceWindow::peer_data(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) return nullptr;
  return peers_[static_cast<size_t>(peer)].data;
}

size_t DeviceWindow::peer_bytes(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) return 0;
  return peers_[static_cast<size_t>(peer)].bytes;
}

void DeviceWindow::sweep_retired() { sweep(); }

size_t DeviceWindow::retired_for_testing() {
  sweep();
  std::lock_guard<std::mutex> lock(retired_mu);
  return retired().size();
}

}  // namespace rr
