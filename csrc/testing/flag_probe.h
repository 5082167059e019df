// What one barrier between two processes on one GPU costs, signalled three
// ways, for bench/gpu_flag_probe.py. The device window all_reduce
// (algorithms/window_all_reduce.h) meets its peers twice a call; today the
// host does it (a device synchronize, then a word of shared memory). Before
// the phases move into the device's own queue, this measures what each way
// costs where it matters most: ranks time-slicing one GPU, with and without
// MPS.
//
// Each rank owns one 64-bit flag in host memory both processes map (a page
// the caller shares), and a barrier is: write the next value into ours, wait
// until the peer's is at least that. The three ways:
//   "host"   - a one-thread kernel, a stream synchronize, then the host writes
//              our flag and spins on the peer's (what the window path does).
//   "memops" - the same kernel, then the stream itself writes our flag and
//              waits on the peer's (cuStreamWriteValue64 / cuStreamWaitValue64
//              on the page, locked and mapped for the device): the host only
//              queues, and waits once per 64 barriers.
//   "spin"   - one kernel for all the barriers, its thread writing our flag
//              and spinning on the peer's in host memory (what a persistent
//              kernel does). On a time-sliced GPU the peer's kernel runs only
//              when ours is switched out, so this shows the time slice.
// Every wait has a deadline: the kernel gives up after `timeout_s` (it reads
// the GPU's global timer), and the host releases a stream stuck on the peer's
// flag by writing it (the probe's flags are its own: a late peer only reads
// more barriers passed than it made).
#pragma once

#include <cstdint>
#include <string>

namespace rr::testing {

struct FlagProbe {
  double seconds = 0;      // from the first barrier to the last one passed
  int completed = 0;       // barriers passed
  bool timed_out = false;  // the deadline came first
};

// Rank `rank` (0 or 1) of the pair: flags[16 * rank] is ours, flags[16 * (1 -
// rank)] the peer's (a cache line apart), and flags[16 * (2 + rank)] our ready
// word, which says we are set up (the clock starts once both are), in host
// memory of `page_bytes` (at least 512) at `flags` that both processes map
// (page-aligned). Barrier i writes first + i; `first` must exceed every value
// either flag held before, and both ranks pass the same. On CUDA device
// `device`; throws Error on a CUDA error or an unknown mode.
FlagProbe flag_probe(const std::string& mode, uint64_t* flags, size_t page_bytes, int rank,
                     uint64_t first, int iters, double timeout_s, int device);

}  // namespace rr::testing
