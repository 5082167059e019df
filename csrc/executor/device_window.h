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
//
// Freeing. CUDA leaves it undefined to cudaFree memory another process still
// has open through IPC, and each rank drops its array when it likes. So each
// window comes with a small host segment of flags (a SharedWindow every rank
// maps): a rank that closes its mappings of the peers' memory says so in each
// owner's flags, and an owner frees its memory only once every peer has said
// so. Until then the memory waits in a list of retired windows, swept
// whenever a device window is made or dropped. A peer that dies without
// saying so leaves its owner's memory to be freed at the process's exit.
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
  // zeroed; `handle` receives what the peers need to map it. With `control`
  // (a host window of at least control_bytes(size), made with it) the
  // peers' closing is tracked as above; without, the window is this rank's
  // alone and freed when dropped.
  DeviceWindow(uint64_t id, std::shared_ptr<Device> device, int device_id, size_t bytes, int rank,
               int size, Device::SharedHandle* handle, std::shared_ptr<SharedWindow> control);
  ~DeviceWindow() override;
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;

  // The host flags a window needs: one word per rank.
  static size_t control_bytes(int size) { return sizeof(uint32_t) * static_cast<size_t>(size); }

  // Maps `peer`'s window (`bytes` of CUDA device `peer_device`, its handle);
  // throws Error naming the peer.
  void map(int peer, const Device::SharedHandle& handle, size_t bytes, int peer_device);
  // Some rank could not map every peer's: the window is this rank's memory
  // alone (the peers' mappings go now, said closed), and `why` says so.
  void unshare(const std::string& why);
  bool shared() const { return unshared_.empty(); }
  // No peer ever had the handle: freed at once when dropped.
  void mapped_by_nobody() { control_.reset(); }
  const std::string& unshared_reason() const { return unshared_; }

  int device() const override { return device_id_; }
  char* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  char* peer_data(int peer) const override;
  size_t peer_bytes(int peer) const override;

  // Frees the memory of retired windows that every peer has closed (also
  // done whenever a device window is made or dropped, and at close()).
  static void sweep_retired();
  // Tests: this process's windows whose arrays are gone but whose memory a
  // peer may still map (retired, not yet freed), after a sweep.
  static size_t retired_for_testing();

 private:
  struct Mapped {
    char* data = nullptr;
    size_t bytes = 0;
  };
  // Closes our mappings of the peers' memory, and tells each owner.
  void close_peers();

  std::shared_ptr<Device> device_;  // outlives the communicator if the array does
  int device_id_;
  size_t bytes_;
  int rank_;
  char* data_ = nullptr;
  std::vector<Mapped> peers_;              // by rank; empty for ourselves
  std::shared_ptr<SharedWindow> control_;  // the flags: ours, and the peers' mapped
  std::string unshared_;                   // why it is not shared; empty while it is
};

}  // namespace rr
