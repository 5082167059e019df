// Device windows: memory of a GPU that every rank of the host maps (comm.empty
// with device="cuda"), so that an all_reduce whose buffers all lie in device
// windows reduces straight out of the peers' device memory, with no host
// staging (algorithms/window_all_reduce.h). The host windows' twin
// (transport/shm/shm_window.h): made collectively, the k-th window of a
// communicator has id k on every rank, and it lives as long as the array over
// it, with the peers' mappings of the same id.
//
// The memory and its sharing are the Device's (executor/device.h): cudaMalloc
// and CUDA IPC handles on a GPU, shared-memory segments on the fake device,
// so the protocol is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/device.h"
#include "transport/shm/shm_window.h"

namespace rr {

class DeviceWindow final : public Window {
 public:
  // This rank's window `id` of `bytes` (> 0) on CUDA device `device_id`,
  // zeroed; `handle` receives what the peers need to map it.
  DeviceWindow(uint64_t id, std::shared_ptr<Device> device, int device_id, size_t bytes, int size,
               Device::SharedHandle* handle);
  ~DeviceWindow() override;
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;

  // Maps `peer`'s window (`bytes` of CUDA device `peer_device`, its handle);
  // throws Error naming the peer.
  void map(int peer, const Device::SharedHandle& handle, size_t bytes, int peer_device);
  // Some rank could not map every peer's: the window is this rank's memory
  // alone (the peers' mappings go now), and `why` says so.
  void unshare(const std::string& why);
  bool shared() const { return unshared_.empty(); }
  const std::string& unshared_reason() const { return unshared_; }

  int device() const override { return device_id_; }
  char* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  char* peer_data(int peer) const override;
  size_t peer_bytes(int peer) const override;

 private:
  struct Mapped {
    char* data = nullptr;
    size_t bytes = 0;
  };
  std::shared_ptr<Device> device_;  // outlives the communicator if the array does
  int device_id_;
  size_t bytes_;
  char* data_ = nullptr;
  std::vector<Mapped> peers_;  // by rank; empty for ourselves
  std::string unshared_;       // why it is not shared; empty while it is (or may be)
};

}  // namespace rr
