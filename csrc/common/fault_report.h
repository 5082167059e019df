// A last word on SIGBUS and SIGSEGV, for debugging: which signal, its si_code
// (BUS_ADRERR: an access past the end of a mapped file or memfd, as a stale
// shared-memory segment gives; SEGV_MAPERR: no mapping there), the faulting
// address, and the line of /proc/self/maps that holds it (which segment it
// was, or none). Python's faulthandler shows where the interpreter was; this
// shows what the engine touched.
//
// The handler writes to stderr with write(2) alone (no malloc, no stdio, no
// locks) from static buffers, so it is safe in a signal handler and on a small
// alternate signal stack. Then it puts back the handler it replaced (Python's
// faulthandler, or the default action) and lets the fault happen again, so the
// previous handler still runs and the process still dies of the same signal.
#pragma once

namespace rr {

// Installs the handler for SIGBUS and SIGSEGV (once; later calls do nothing).
// Returns whether this call installed it.
bool install_fault_report();

// Installs it when `debug_topics` (RINGREDUCE_DEBUG's value, a comma-separated
// list, or null) names "faults" or "all", or always in a build with
// -DRINGREDUCE_FAULT_REPORT or without NDEBUG (a CMake Debug build). The
// module calls it with null when it is imported (debug builds); the
// environment is read by ringreduce._env, which calls install_fault_report().
bool install_fault_report_if_requested(const char* debug_topics);

}  // namespace rr
