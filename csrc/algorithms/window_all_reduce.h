// all_reduce in place over windows (transport/shm/shm_window.h): when every
// rank's input and output lie in windows of the communicator (comm.empty),
// each rank reduces its chunk of the vector straight out of every rank's
// input, in rank order and in one pass (reduce_all, reduce/cpu_kernels.h:
// 16-bit floats accumulate in float32 and round once), and writes each
// reduced block into every rank's output while it is in the cache. Each input
// is read once and each result written once per rank, where the ring copies
// every message into a slot and out again. In device windows one kernel does
// the same for the whole chunk (Device::reduce_all), with the same bits.
//
// Three waits on the peers, all on the bulletin (transport/bulletin.h): every
// rank's call header, read by all (it carries where the rank's buffers lie in
// its windows, and its publication says that its input is ready and its
// output free); every peer's phase at `located` (it found every rank's
// buffers: nobody touches a rank's memory before the rank has said so, so a
// rank that refuses, a mismatch or a window it lost, leaves its buffers as
// they were); and every peer's phase at `done` (its chunk is in every output
// and it reads no input any more). A failure after `located` raises the
// refusal bit and waits, deaf to Ctrl-C and at most the timeout, until every
// peer is done, refused or gone: nothing writes into the caller's array after
// the call returns or raises.
//
// Writing a block into a peer's output that is its input too (in place) is
// safe: only the chunk's owner reads any rank's input there, and it has.
//
// Every rank chooses it from its own buffers: a rank whose buffers are not
// all in windows runs another algorithm, and the headers, which carry the
// algorithm, differ (MismatchError on every rank, naming the window path).
#pragma once

#include <cstddef>
#include <string>

#include "algorithms/collective.h"

namespace rr {

// Up to this size the one-step exchange of whole vectors (Algorithm::kDirect)
// beats the window path's three waits on every peer: measured at 2 ranks level
// at 4 KiB and 1.2x faster at 1 KiB, at 4 ranks on 2 cores level at 16 KiB and
// 1.4-1.5x faster at 1 KiB (docs/performance.md).
inline size_t window_min_bytes(int size) { return size_t{4096} * static_cast<size_t>(size); }

// Whether this rank's buffers take the window path: an all_reduce, on ranks
// that all share this host, input and output each inside one of the
// communicator's windows (the same memory, or not overlapping): host windows
// above window_min_bytes, device windows at any size on at most
// Device::kMaxReduceAll ranks (the addresses one kernel takes).
bool window_buffers(const RingContext& ctx, const CollectiveArgs& args);

// Why a rank whose buffers are in windows does not take the window path, for
// explain(): "not the window path: <why>", or empty where its buffers take
// it, or where neither buffer is in a window (nothing to explain).
std::string window_passed_over(const RingContext& ctx, const CollectiveArgs& args);

void window_all_reduce(RingContext& ctx, const CollectiveArgs& args);

}  // namespace rr
