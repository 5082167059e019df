// all_reduce in place over windows (transport/shm/shm_window.h): when every
// rank's input and output lie in windows of the communicator (comm.empty),
// each rank reduces its chunk of the vector straight out of every rank's
// input, in rank order, and writes each reduced block into every rank's
// output while it is in the cache. Each input is read once and each result
// written once per rank, where the ring copies every message into a slot and
// out again.
//
// Two waits on the peers, both on the bulletin (transport/bulletin.h): every
// rank's call header, read by all (it carries where the rank's buffers lie in
// its windows, and its publication says that its input is ready and its
// output free); then every peer's phase, which a rank raises to the call's
// number once its chunk is in every output and it reads no input any more.
// After both, this rank's output is whole and nobody touches its buffers.
//
// Writing a block into a peer's output that is its input too (in place) is
// safe: only the chunk's owner reads any rank's input there, and it has.
//
// Every rank chooses it from its own buffers: a rank whose buffers are not
// all in windows runs another algorithm, and the headers, which carry the
// algorithm, differ (MismatchError on every rank, naming the window path).
#pragma once

#include "algorithms/collective.h"

namespace rr {

// Whether this rank's buffers allow the window path: an all_reduce of host
// memory, more than the bulletin carries alone, on ranks that all share this
// host, input and output each inside one of the communicator's windows (the
// same memory, or not overlapping).
bool window_buffers(const RingContext& ctx, const CollectiveArgs& args);

void window_all_reduce(RingContext& ctx, const CollectiveArgs& args);

}  // namespace rr
