#include "executor/device_window.h"

#include <utility>

namespace rr {

DeviceWindow::DeviceWindow(uint64_t id, std::shared_ptr<Device> device, int device_id, size_t bytes,
                           int size, Device::SharedHandle* handle)
    : Window(id),
      device_(std::move(device)),
      device_id_(device_id),
      bytes_(bytes),
      peers_(static_cast<size_t>(size)) {
  data_ = static_cast<char*>(device_->allocate_shared(bytes, handle));
}

DeviceWindow::~DeviceWindow() {
  for (Mapped& m : peers_) {
    if (m.data != nullptr) device_->unmap_shared(m.data);
  }
  device_->release_shared(data_);
}

void DeviceWindow::map(int peer, const Device::SharedHandle& handle, size_t bytes,
                       int peer_device) {
  Mapped& m = peers_.at(static_cast<size_t>(peer));
  m.data = static_cast<char*>(device_->map_shared(handle, bytes, peer, peer_device));
  m.bytes = bytes;
}

void DeviceWindow::unshare(const std::string& why) {
  for (Mapped& m : peers_) {
    if (m.data != nullptr) device_->unmap_shared(m.data);
    m = {};
  }
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

}  // namespace rr
