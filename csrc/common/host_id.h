// Which ranks share a host, and so can share memory.
#pragma once

#include <string>

namespace rr {

// This process's host, as a string equal for exactly the processes that can
// share memory and see each other's pids: the host name, the kernel's boot id
// and the network namespace. Ranks in different network namespaces count as
// different hosts, as emulated hosts should (they may still share a kernel).
// Options::host_id (RINGREDUCE_HOST_ID), when set, replaces it (to force or
// forbid sharing): the caller decides, this reads no environment.
std::string host_identity();

}  // namespace rr
