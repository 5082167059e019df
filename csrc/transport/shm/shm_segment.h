// A home segment (shm_layout.h) as an owned mapping, made or attached so that
// nothing in it is trusted before it is checked.
//
// Made: a memfd, sized, its header's pages reserved with fallocate, mapped,
// and stamped with a header carrying the layout version, the size and a
// random nonce. Every other page is reserved (reserve()) before it is first
// written, by whoever writes it: a host out of shared memory then fails
// with an error naming the rank, instead of a SIGBUS on the first touch of a
// page the kernel cannot supply. Only the inboxes a rank is sent to take
// memory (ShmTransport reserves them).
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

// Tests only: false makes segments made from now on in this process unable to
// reserve through their mapping, as on kernels without MADV_POPULATE_WRITE.
void set_populate_for_testing(bool allowed);
bool populate_allowed();

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
  // Reserves the pages of [offset, offset + len), so that touching them cannot
  // SIGBUS: fallocate through the fd while there is one, else
  // madvise(MADV_POPULATE_WRITE) through the mapping (Linux 5.14). Throws
  // Error, saying the bytes were `what` ("in the segment of rank 3"), when the
  // host has no memory for them; false where the kernel reserves nothing
  // (then pages come at first touch, as with any mapping).
  bool reserve(size_t offset, size_t len, const std::string& what);
  // For an attached segment, once the reservations made while connecting are
  // done: closes the fd where the mapping can reserve from here on; keeps it
  // (true) on kernels where it cannot.
  bool keep_fd_only_if_needed();
  // The owner's fd has done its job once every peer has mapped the segment
  // (and holds an fd of its own): the memory lives as long as a mapping does.
  void close_fd() { fd_.reset(); }
  // Unlocks whatever a device page-locked in it (common/page_lock.h), then
  // unmaps it.
  void unmap() noexcept;

 private:
  int populate(size_t offset, size_t len);  // 0 or the errno of madvise
  char* base_ = nullptr;
  size_t bytes_ = 0;
  Fd fd_;
  uint64_t inode_ = 0;
  bool populate_ = populate_allowed();  // false once madvise could not (old kernels)
  bool reservable_ = true;              // false once fallocate said this file cannot reserve
};

}  // namespace shm
}  // namespace rr
