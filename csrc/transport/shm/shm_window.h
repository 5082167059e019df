// Windows: memory a rank allocates that every other rank of its host maps
// (comm.empty in Python, as MPI_Win_allocate_shared and NCCL's registered
// user buffers), so that an all_reduce whose buffers all lie in windows reads
// its peers' data where it is, with one copy instead of two
// (algorithms/window_all_reduce.h).
//
// Each window is a segment of its own (shm_segment.h: a memfd, checked by
// whoever attaches it), its pages reserved whole when it is made, so that a
// host out of shared memory fails there with an error naming the rank, not
// with a SIGBUS later. Making one is collective: every rank of the
// communicator makes its own, of any size, and maps everyone else's; the k-th
// window made on a communicator has id k on every rank.
//
// A window lives as long as the array over it. The mappings of the peers'
// windows of the same id live with it; a peer's memory stays valid for as
// long as we map it, whatever the peer does with its own array.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "transport/shm/shm_segment.h"

namespace rr {

// A window as the collectives see it: this rank's memory and every peer's as
// mapped here. Host windows are SharedWindow (below); device windows
// (executor/device_window.h) hold memory of a GPU that every rank of the host
// maps through the Device.
class Window {
 public:
  virtual ~Window() = default;
  uint64_t id() const { return id_; }
  // -1: host memory; else the CUDA device that owns data().
  virtual int device() const { return -1; }
  virtual char* data() const = 0;
  virtual size_t bytes() const = 0;
  // `peer`'s window of this id as mapped here, and its size; null/0 if not.
  virtual char* peer_data(int peer) const = 0;
  virtual size_t peer_bytes(int peer) const = 0;

 protected:
  explicit Window(uint64_t id) : id_(id) {}

 private:
  uint64_t id_;
};

class SharedWindow final : public Window {
 public:
  // Where a window's data starts in its segment: after the header's pages.
  static size_t data_offset();

  // This rank's window `id` of `bytes` (> 0), its pages reserved.
  static std::shared_ptr<SharedWindow> create(uint64_t id, size_t bytes, int rank, int size);

  explicit SharedWindow(uint64_t id) : Window(id) {}

  // What the peers need to attach it (valid until attached_by_all()).
  shm::SegmentRecord record() const { return own_.record(); }
  // Maps `peer`'s window, which `record` names; throws Error naming the peer.
  void attach(int peer, const shm::SegmentRecord& record);
  // Every peer has mapped ours: our fd has done its job.
  void attached_by_all() { own_.close_fd(); }

  char* data() const override { return own_.base() + data_offset(); }
  size_t bytes() const override { return bytes_; }
  char* peer_data(int peer) const override;
  size_t peer_bytes(int peer) const override;

 private:
  size_t bytes_ = 0;
  shm::Segment own_;
  std::vector<shm::Segment> peers_;  // by rank; unmapped for ourselves
};

// A communicator's windows, by id, as weak references: the arrays own them.
class WindowRegistry {
 public:
  struct Place {
    std::shared_ptr<Window> window;        // held for the call
    uint64_t offset = 0;                   // of the buffer in the window's data
  };

  uint64_t next_id() { return ++made_; }
  void add(const std::shared_ptr<Window>& window);
  // The window of ours that holds all of [p, p + bytes), if one does.
  std::optional<Place> find(const void* p, size_t bytes) const;
  // Our window `id` while it is alive (null once its array is gone).
  std::shared_ptr<Window> get(uint64_t id) const;
  // Cheap: whether any window was ever made here (the common case is none).
  bool any() const { return any_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::weak_ptr<Window>> windows_;
  uint64_t made_ = 0;
  std::atomic<bool> any_{false};
};

}  // namespace rr
