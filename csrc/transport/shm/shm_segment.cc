#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <new>

#include "common/error.h"
#include "common/page_lock.h"
#include "security/auth.h"

namespace rr {
namespace shm {
namespace {

#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;  // Linux 5.14
#endif

std::string of_rank(int owner) { return "the segment of rank " + std::to_string(owner); }

std::atomic<bool> g_populate{true};

}  // namespace

void set_populate_for_testing(bool allowed) { g_populate.store(allowed); }
bool populate_allowed() { return g_populate.load(std::memory_order_relaxed); }

std::string SegmentRecord::encode() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%d:%d:%" PRIu64 ":%" PRIu64 ":%016" PRIx64, static_cast<int>(pid),
                fd, inode, bytes, nonce);
  return buf;
}

SegmentRecord SegmentRecord::decode(const std::string& text, int owner) {
  SegmentRecord r;
  int pid = 0;
  int used = 0;
  if (text.size() > 100 ||
      std::sscanf(text.c_str(), "%d:%d:%" SCNu64 ":%" SCNu64 ":%" SCNx64 "%n", &pid, &r.fd,
                  &r.inode, &r.bytes, &r.nonce, &used) != 5 ||
      static_cast<size_t>(used) != text.size() || pid <= 0 || r.fd < 0) {
    throw Error("shared memory: rank " + std::to_string(owner) +
                " published no valid segment record (got '" + text.substr(0, 100) +
                "'); is another program or version writing to this store?");
  }
  r.pid = static_cast<pid_t>(pid);
  return r;
}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    unmap();
    base_ = other.base_;
    bytes_ = other.bytes_;
    fd_ = std::move(other.fd_);
    inode_ = other.inode_;
    reservable_ = other.reservable_;
    populate_ = other.populate_;
    other.base_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Segment::unmap() noexcept {
  if (base_ == nullptr) return;
  page_lock::forget(base_, bytes_);  // a device's locks on it go first (common/page_lock.h)
  ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

bool Segment::reserve(size_t offset, size_t len, const std::string& what) {
  if (len == 0) return false;
  const auto cannot = [&](int err) {
    return Error(errno_message("shared memory: cannot reserve " + std::to_string(len) + " bytes " +
                                   what +
                                   " (is the host out of shared memory? see /dev/shm and the "
                                   "memory limit)",
                               err));
  };
  if (reservable_ && fd_.valid()) {
    if (::fallocate(fd_.get(), 0, static_cast<off_t>(offset), static_cast<off_t>(len)) == 0) {
      return true;
    }
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) throw cannot(err);
    reservable_ = false;  // this file cannot: try the mapping
  }
  const int err = populate(offset, len);
  if (err == 0) return true;
  if (err == EINVAL || err == EOPNOTSUPP || err == ENOSYS) {
    return false;  // nothing reserves here: pages come at first touch, as with any mapping
  }
  throw cannot(err);
}

int Segment::populate(size_t offset, size_t len) {
  if (!populate_ || base_ == nullptr) return EINVAL;
  // Fault the pages in as a write would, through our mapping: where the kernel cannot
  // supply one, an error instead of the SIGBUS a touch would raise.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t from = offset / page * page;
  const size_t to = std::min(bytes_, (offset + len + page - 1) / page * page);
  int err = 0;
  while ((err = ::madvise(base_ + from, to - from, kPopulateWrite) == 0 ? 0 : errno) == EINTR) {
  }
  if (err == EINVAL) populate_ = false;  // a kernel before 5.14
  return err;
}

bool Segment::keep_fd_only_if_needed() {
  // The header's first page exists (its owner stamped it): populating it costs
  // nothing and says whether the mapping can reserve.
  if (!fd_.valid() || populate(0, 1) != 0) return fd_.valid();
  fd_.reset();
  return false;
}

Segment Segment::create(size_t bytes) {
  if (bytes < sizeof(Header)) throw Error("shared memory: a segment smaller than its header");
  Segment s;
  s.fd_ = Fd(static_cast<int>(::syscall(SYS_memfd_create, "ringreduce", MFD_CLOEXEC)));
  if (!s.fd_.valid()) throw Error(errno_message("shared memory: memfd_create failed", errno));
  // Sized, not filled: the header's pages are reserved here, the inboxes' as they are
  // first written (ShmTransport), so a rank holds memory for the peers it talks to.
  if (::ftruncate(s.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    throw Error(errno_message("shared memory: cannot size the segment", errno));
  }
  s.reserve(0, sizeof(Header), "for this rank's segment");
  struct stat st{};
  if (::fstat(s.fd_.get(), &st) != 0) {
    throw Error(errno_message("shared memory: cannot stat this rank's segment", errno));
  }
  s.inode_ = static_cast<uint64_t>(st.st_ino);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_.get(), 0);
  if (base == MAP_FAILED) throw Error(errno_message("shared memory: mmap failed", errno));
  s.base_ = static_cast<char*>(base);
  s.bytes_ = bytes;
  Header* h = new (s.base_) Header();
  h->magic = kMagic;
  h->version = kLayoutVersion;
  h->bytes = bytes;
  h->nonce = random_u64();
  h->pid = static_cast<int32_t>(::getpid());
  return s;
}

SegmentRecord Segment::record() const {
  SegmentRecord r;
  r.pid = ::getpid();
  r.fd = fd_.get();
  r.inode = inode_;
  r.bytes = bytes_;
  r.nonce = header()->nonce;
  return r;
}

Segment Segment::attach(const SegmentRecord& record, size_t expected_bytes, int owner) {
  const std::string path =
      "/proc/" + std::to_string(record.pid) + "/fd/" + std::to_string(record.fd);
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    throw Error(errno_message("shared memory: cannot open " + of_rank(owner) + " (" + path +
                                  (err == ENOENT ? "; its process or fd is gone"
                                                 : "; processes of one host must be able to see "
                                                   "each other's /proc, or use transport='tcp'") +
                                  ")",
                              err));
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) {
    throw Error(errno_message("shared memory: cannot stat " + of_rank(owner), errno));
  }
  if (static_cast<uint64_t>(st.st_ino) != record.inode) {
    throw Error("shared memory: " + of_rank(owner) + " is not there: " + path +
                " now holds another file (inode " + std::to_string(st.st_ino) + ", published " +
                std::to_string(record.inode) + "); a stale rendezvous record?");
  }
  if (record.bytes != expected_bytes) {
    throw Error("shared memory: " + of_rank(owner) +
                " has another layout: " + std::to_string(record.bytes) +
                " bytes where this rank's settings make " + std::to_string(expected_bytes) +
                " (a different ringreduce version or settings on the two ranks)");
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != record.bytes) {
    throw Error("shared memory: " + of_rank(owner) + " is " + std::to_string(st.st_size) +
                " bytes long where " + std::to_string(record.bytes) +
                " were published; refusing to map it");
  }
  Segment s;
  void* base = ::mmap(nullptr, record.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    throw Error(errno_message("shared memory: cannot map " + of_rank(owner), errno));
  }
  s.base_ = static_cast<char*>(base);
  s.bytes_ = record.bytes;
  s.fd_ = std::move(fd);  // to reserve through (keep_fd_only_if_needed)
  const Header* h = s.header();
  if (h->magic != kMagic || h->version != kLayoutVersion) {
    throw Error("shared memory: " + of_rank(owner) +
                " has another layout (not a ringreduce segment of layout version " +
                std::to_string(kLayoutVersion) + ": a different ringreduce version?)");
  }
  if (h->bytes != record.bytes || h->nonce != record.nonce ||
      h->pid != static_cast<int32_t>(record.pid)) {
    throw Error("shared memory: " + of_rank(owner) +
                " does not match its rendezvous record (size, nonce or pid differ): a stale "
                "record, or another communicator's segment");
  }
  return s;
}

}  // namespace shm
}  // namespace rr
