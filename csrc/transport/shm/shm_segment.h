// A home segment (shm_layout.h) as an owned mapping, made or attached so that
// nothing in it is trusted before it is checked.
//
// Made: a memfd whose pages are reserved up front with fallocate (a host out
// of shared memory fails here, with an error, instead of a SIGBUS on some
// later first touch), mapped, and stamped with a header carrying the layout
// version, the size and a random nonce.
//
// Published through the store as "pid:fd:inode:bytes:nonce".
//
// Attached: the peer opens /proc/<pid>/fd/<fd>, and before mapping fstat()s
// what it opened: the inode and size must be the published ones (a stale
// record, a reused fd number or a file not yet sized is caught here, where
// it used to be mapped and touched). Only then is it mapped, and the header
// is checked (magic, version, size, nonce, pid) before any other read. Every
// failure is an Error naming the owner's rank and the reason; the mapping of
// a failed attach is undone.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/socket.h"
#include "transport/shm/shm_layout.h"

namespace rr {
namespace shm {

// Where a segment can be found, as published through the store.
struct SegmentRecord {
  pid_t pid = 0;
  int fd = -1;
  uint64_t inode = 0;
  uint64_t bytes = 0;
  uint64_t nonce = 0;

  std::string encode() const;
  // Throws Error naming `owner` (a rank) when `text` is not a record.
  static SegmentRecord decode(const std::string& text, int owner);
};

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& other) noexcept { *this = std::move(other); }
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() { unmap(); }

  // A new segment of `bytes` (at least sizeof(Header)), its header stamped
  // with magic, version, size, nonce and pid; the other fields are zero.
  static Segment create(size_t bytes);
  // Maps the segment `record` names, of rank `owner`, after checking that it
  // is the one published and `expected_bytes` long (our layout's size).
  static Segment attach(const SegmentRecord& record, size_t expected_bytes, int owner);

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  Header* header() const { return reinterpret_cast<Header*>(base_); }
  bool mapped() const { return base_ != nullptr; }
  // What peers need to attach (valid while the fd is open).
  SegmentRecord record() const;
  // The fd has done its job once every peer has mapped the segment: the
  // memory lives as long as a mapping does.
  void close_fd() { fd_.reset(); }
  void unmap() noexcept;

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  Fd fd_;
  uint64_t inode_ = 0;
};

}  // namespace shm
}  // namespace rr
