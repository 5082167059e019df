// all_reduce in place over windows (transport/shm/shm_window.h): when every
// rank's input and output lie in windows of the communicator (comm.empty),
// each rank reduces its chunk of the vector straight out of every rank's
// input, in rank order, into its own output, and then copies every other
// chunk out of its owner's output. Each input is read once and each result
// copied once, where the ring copies every message into a slot and out again.
//
// Its waits, all on the bulletin (transport/bulletin.h): every rank's call
// header, read by all (it carries where the rank's buffers lie in its
// windows, and its publication says the rank's input is ready); each block
// of a peer's chunk reduced (the peer's phase), before copying it; every
// peer done copying out of our output, before the call returns and the
// caller may write into it again.
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
