// A tiny all_reduce on the bulletin alone (the route engine/choice.h picks for
// an all_reduce of the direct path that fits one entry, where the transport
// has a bulletin: shared memory). Each rank publishes its header and its data
// as one entry, reads every peer's, checks each header against its own and
// reduces in rank order (the bits of the direct path). One write and N - 1
// reads of two cache lines, and no message. Every rank decides it from the
// call's header fields, so all take it or the headers differ.
#pragma once

#include <cstddef>

#include "algorithms/call_header.h"
#include "algorithms/collective.h"
#include "transport/bulletin.h"

namespace rr {

// The most data bytes one entry carries beside its header.
constexpr size_t kBulletinDataBytes = Bulletin::kEntryBytes - sizeof(CallHeader);

void bulletin_all_reduce(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm);

}  // namespace rr
