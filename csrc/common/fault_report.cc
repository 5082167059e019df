// The SIGBUS/SIGSEGV report (fault_report.h). Everything the handler calls is
// async-signal-safe: write, open, read, close, sigaction, raise, syscall.
// Its buffers are static, not on the stack, which may be a small alternate
// one; a flag lets only the first faulting thread use them.
#include "common/fault_report.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace rr {
namespace {

constexpr int kSignals[] = {SIGBUS, SIGSEGV};
struct sigaction previous[2];  // what we replaced, per kSignals entry
std::atomic<bool> installed{false};
std::atomic<bool> reporting{false};

// A line of text built in place, for one write(2).
struct Line {
  char text[512];
  size_t size = 0;

  void add(const char* s) {
    while (*s != '\0' && size < sizeof(text)) text[size++] = *s++;
  }
  void add(const char* s, size_t n) {
    for (size_t i = 0; i < n && size < sizeof(text); ++i) text[size++] = s[i];
  }
  void add_hex(uintptr_t v) {
    char digits[2 * sizeof(v)];
    size_t n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v & 0xf];
      v >>= 4;
    } while (v != 0);
    add("0x");
    while (n > 0 && size < sizeof(text)) text[size++] = digits[--n];
  }
  void add_dec(long v) {
    char digits[24];
    size_t n = 0;
    const bool negative = v < 0;
    unsigned long u =
        negative ? 0ul - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) add("-");
    while (n > 0 && size < sizeof(text)) text[size++] = digits[--n];
  }
};

Line line;
char maps_chunk[4096];
char maps_line[4096];

void write_all(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t done = ::write(STDERR_FILENO, data, n);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return;
    data += done;
    n -= static_cast<size_t>(done);
  }
}

void flush_line() {
  write_all(line.text, line.size);
  line.size = 0;
}

const char* signal_name(int sig) { return sig == SIGBUS ? "SIGBUS" : "SIGSEGV"; }

// si_code's name for these two signals (or a generic one), null if unknown.
const char* code_name(int sig, int code) {
  if (sig == SIGBUS) {
    switch (code) {
      case BUS_ADRALN:
        return "BUS_ADRALN (misaligned address)";
      case BUS_ADRERR:
        return "BUS_ADRERR (no backing: past the end of a mapped file or memfd)";
      case BUS_OBJERR:
        return "BUS_OBJERR (hardware error on the object)";
#ifdef BUS_MCEERR_AR
      case BUS_MCEERR_AR:
        return "BUS_MCEERR_AR (memory error, action required)";
      case BUS_MCEERR_AO:
        return "BUS_MCEERR_AO (memory error, action optional)";
#endif
    }
  } else {
    switch (code) {
      case SEGV_MAPERR:
        return "SEGV_MAPERR (address not mapped)";
      case SEGV_ACCERR:
        return "SEGV_ACCERR (mapping's permissions forbid the access)";
#ifdef SEGV_BNDERR
      case SEGV_BNDERR:
        return "SEGV_BNDERR (bounds check failed)";
#endif
#ifdef SEGV_PKUERR
      case SEGV_PKUERR:
        return "SEGV_PKUERR (protection key)";
#endif
    }
  }
  switch (code) {
    case SI_USER:
      return "SI_USER (sent by kill)";
    case SI_KERNEL:
      return "SI_KERNEL";
    case SI_QUEUE:
      return "SI_QUEUE (sent by sigqueue)";
    case SI_TKILL:
      return "SI_TKILL (sent by tkill or raise)";
  }
  return nullptr;
}

// Parses the hex number at *p, advancing past it.
uintptr_t parse_hex(const char** p, const char* end) {
  uintptr_t v = 0;
  for (; *p < end; ++*p) {
    const char c = **p;
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      break;
    }
    v = v << 4 | static_cast<uintptr_t>(d);
  }
  return v;
}

// Whether this maps line ("start-end perms offset dev inode path") holds addr.
bool line_holds(const char* text, size_t n, uintptr_t addr, uintptr_t* start) {
  const char* p = text;
  const char* end = text + n;
  *start = parse_hex(&p, end);
  if (p == end || *p != '-') return false;
  ++p;
  const uintptr_t stop = parse_hex(&p, end);
  return *start <= addr && addr < stop;
}

// Writes the line of /proc/self/maps that holds addr, or says there is none.
void report_mapping(uintptr_t addr) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    line.add("ringreduce: (cannot open /proc/self/maps)\n");
    flush_line();
    return;
  }
  size_t held = 0;  // bytes of the current line in maps_line
  bool found = false;
  for (;;) {
    const ssize_t got = ::read(fd, maps_chunk, sizeof(maps_chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t i = 0; i < got && !found; ++i) {
      const char c = maps_chunk[i];
      if (c != '\n') {
        if (held < sizeof(maps_line)) maps_line[held++] = c;  // longer lines are cut
        continue;
      }
      uintptr_t start = 0;
      if (line_holds(maps_line, held, addr, &start)) {
        found = true;
        line.add("ringreduce: si_addr is ");
        line.add_hex(addr - start);
        line.add(" bytes into the mapping: ");
        flush_line();
        write_all(maps_line, held);
        write_all("\n", 1);
      }
      held = 0;
    }
    if (found) break;
  }
  ::close(fd);
  if (!found) {
    line.add("ringreduce: si_addr lies in no mapping of /proc/self/maps\n");
    flush_line();
  }
}

// Puts back the handlers we replaced (an ignored fault is made fatal again).
void restore_previous() {
  for (size_t i = 0; i < 2; ++i) {
    struct sigaction act = previous[i];
    if (!(act.sa_flags & SA_SIGINFO) && act.sa_handler == SIG_IGN) act.sa_handler = SIG_DFL;
    ::sigaction(kSignals[i], &act, nullptr);
  }
}

void on_fault(int sig, siginfo_t* info, void* /*context*/) {
  const int saved_errno = errno;
  if (!reporting.exchange(true)) {
    line.add("ringreduce: fatal ");
    line.add(signal_name(sig));
    line.add(" in pid ");
    line.add_dec(static_cast<long>(::getpid()));
    line.add(" tid ");
    line.add_dec(static_cast<long>(::syscall(SYS_gettid)));
    line.add(": si_code=");
    const char* name = code_name(sig, info->si_code);
    if (name != nullptr) {
      line.add(name);
    } else {
      line.add_dec(info->si_code);
    }
    if (info->si_code > 0) {
      line.add(" si_addr=");
      line.add_hex(reinterpret_cast<uintptr_t>(info->si_addr));
    } else {
      line.add(" from pid ");
      line.add_dec(static_cast<long>(info->si_pid));
    }
    line.add("\n");
    flush_line();
    if (info->si_code > 0) report_mapping(reinterpret_cast<uintptr_t>(info->si_addr));
  }
  restore_previous();
  errno = saved_errno;
  // A fault the kernel raised happens again when we return, now to the previous
  // handler (with its own siginfo) or the default action; one sent by kill or
  // raise would not, so it is sent again.
  if (info->si_code <= 0) ::raise(sig);
}

// Whether the comma-separated list names "faults" or "all".
bool names_faults(const char* topics) {
  if (topics == nullptr) return false;
  const char* p = topics;
  while (*p != '\0') {
    while (*p == ',' || *p == ' ') ++p;
    const char* start = p;
    while (*p != '\0' && *p != ',') ++p;
    const char* stop = p;
    while (stop > start && stop[-1] == ' ') --stop;
    const size_t n = static_cast<size_t>(stop - start);
    if ((n == 6 && std::strncmp(start, "faults", 6) == 0) ||
        (n == 3 && std::strncmp(start, "all", 3) == 0)) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool install_fault_report() {
  if (installed.exchange(true)) return false;
  struct sigaction act;
  std::memset(&act, 0, sizeof(act));
  act.sa_sigaction = on_fault;
  sigemptyset(&act.sa_mask);
  // SA_ONSTACK: on the thread's alternate stack when it has one (a stack
  // overflow leaves no room on the normal one); SA_NODEFER: a fault inside the
  // handler is not blocked but goes to the (reset) default action.
  act.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
  for (size_t i = 0; i < 2; ++i) ::sigaction(kSignals[i], &act, &previous[i]);
  return true;
}

bool install_fault_report_if_requested(const char* debug_topics) {
#if defined(RINGREDUCE_FAULT_REPORT) || !defined(NDEBUG)
  constexpr bool kBuiltIn = true;
#else
  constexpr bool kBuiltIn = false;
#endif
  return (kBuiltIn || names_faults(debug_topics)) && install_fault_report();
}

}  // namespace rr
