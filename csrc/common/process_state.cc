#include "common/process_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/sha256.h"

namespace rr {
namespace {

enum class Stat { kRead, kGone, kUnknown };

// /proc/<what>/stat's state and starttime. kGone only when /proc says there
// is no such process; a file it will not let us read (hidepid, no free file
// descriptor) says nothing.
Stat read_stat(const std::string& what, char* state, uint64_t* start) {
  const int fd = ::open(("/proc/" + what + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? Stat::kGone : Stat::kUnknown;
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  const int error = errno;
  ::close(fd);
  if (n <= 0) return n < 0 && error == ESRCH ? Stat::kGone : Stat::kUnknown;
  const std::string text(buf, static_cast<size_t>(n));
  // The command name (field 2) is in parentheses and may hold anything: the
  // fields after the last ')' are the state (field 3) on.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return Stat::kUnknown;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) *state = field.empty() ? '?' : field[0];
    if (i == 22) {
      char* end = nullptr;
      *start = std::strtoull(field.c_str(), &end, 10);
      return end != nullptr && *end == '\0' ? Stat::kRead : Stat::kUnknown;
    }
  }
  return Stat::kUnknown;
}

std::array<uint8_t, 16> machine_digest() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  char ns[256];
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  std::array<uint8_t, 16> out{};
  if (id.empty() || n <= 0) return out;
  const Digest d = sha256(id + "/" + std::string(ns, static_cast<size_t>(n)));
  std::copy_n(d.begin(), out.size(), out.begin());
  if (std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; })) out[0] = 1;
  return out;
}

const std::array<uint8_t, 16>& our_machine() {
  static const std::array<uint8_t, 16> machine = machine_digest();
  return machine;
}

}  // namespace

bool ProcessName::known() const {
  return pid != 0 && std::any_of(machine.begin(), machine.end(), [](uint8_t b) { return b; });
}

bool ProcessName::here() const { return known() && machine == our_machine(); }

ProcessName this_process() {
  // A /proc of another pid namespace than ours (unshare -p without mounting
  // one's own) would name other processes by our pids: then we are unknown.
  const std::string pid = std::to_string(::getpid());
  char self[32];
  const ssize_t n = ::readlink("/proc/self", self, sizeof self - 1);
  if (n <= 0 || std::string(self, static_cast<size_t>(n)) != pid) return {};
  ProcessName p;
  char state = 0;
  if (read_stat("self", &state, &p.start) != Stat::kRead) return {};
  p.pid = static_cast<uint32_t>(::getpid());
  p.machine = our_machine();
  return p;
}

namespace {

enum class Halt { kRuns, kStopped, kGone };

Halt halt_of(const ProcessName& p) {
  if (!p.here()) return Halt::kRuns;  // elsewhere: nothing can be said from here
  char state = 0;
  uint64_t start = 0;
  switch (read_stat(std::to_string(p.pid), &state, &start)) {
    case Stat::kGone:
      return Halt::kGone;
    case Stat::kUnknown:
      return Halt::kRuns;
    case Stat::kRead: break;
  }
  if (start != p.start) return Halt::kGone;  // the pid is another process's now
  if (state == 'Z' || state == 'X') return Halt::kGone;
  return state == 'T' || state == 't' ? Halt::kStopped : Halt::kRuns;
}

}  // namespace

bool process_halted(const ProcessName& p) { return halt_of(p) != Halt::kRuns; }

bool process_gone(const ProcessName& p) { return halt_of(p) == Halt::kGone; }

}  // namespace rr
