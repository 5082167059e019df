// Runs one collective on the calling thread, on the route its Choice names
// (engine/choice.h): the bulletin, the windows, or the call header and then
// the collective's schedule on the executor for its memory (host or device).
#pragma once

#include "algorithms/collective.h"
#include "engine/choice.h"

namespace rr {

// Throws the typed errors of common/error.h; on a throw the transport must be
// considered broken.
void dispatch(RingContext& ctx, const CollectiveArgs& args, const Choice& choice);

}  // namespace rr
