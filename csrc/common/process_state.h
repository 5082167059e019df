// Whether a process on this machine is stopped or gone, read from /proc: a
// process stopped by SIGSTOP or a debugger keeps its sockets open (the kernel
// accepts connections for it and nothing answers), so only its machine can
// tell a stopped peer from a slow one.
#pragma once

#include <array>
#include <cstdint>

namespace rr {

// A process as others on its machine can look it up: its pid, its start time
// (so that a pid reused later is not taken for it) and a digest of its machine
// (boot id and pid namespace: where the pid names that process).
struct ProcessName {
  uint32_t pid = 0;
  uint64_t start = 0;                 // /proc/<pid>/stat's starttime
  std::array<uint8_t, 16> machine{};  // all zero: unknown (no /proc)

  bool known() const;
  // True when `machine` is ours: the pid can be looked up here.
  bool here() const;
};

// This process's name (unknown where /proc cannot be read).
ProcessName this_process();

// True when `p` is on this machine and stopped (SIGSTOP, SIGTSTP, a debugger)
// or gone (exited, a zombie, or its pid now another process's). False when it
// runs, or is elsewhere, or unknown: nothing can be said from here.
bool process_halted(const ProcessName& p);
// True when `p` is on this machine and gone (exited, a zombie, or its pid now
// another process's): halted, and not merely stopped.
bool process_gone(const ProcessName& p);

}  // namespace rr
