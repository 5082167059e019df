// The two phases of the ring and the collectives built from them.
#pragma once

#include <cstddef>

#include "algorithms/collective.h"

namespace rr {

// Reduce-scatter over `count` elements: reads `src`, accumulates into `dst`
// (may equal src). Afterwards dst holds the fully reduced chunk of this rank.
void reduce_scatter_phase(RingContext& ctx, const char* src, char* dst, size_t count,
                          DataType dtype, ReduceOp op);

// All-gather over `count` elements of `elem` bytes in place in `buffer`: this
// rank's chunk must be present; afterwards every chunk is.
void all_gather_phase(RingContext& ctx, char* buffer, size_t count, size_t elem);

void ring_all_reduce(RingContext& ctx, const CollectiveArgs& args);
void small_all_reduce(RingContext& ctx, const CollectiveArgs& args);
void ring_reduce_scatter(RingContext& ctx, const CollectiveArgs& args);
void ring_all_gather(RingContext& ctx, const CollectiveArgs& args);
void ring_broadcast(RingContext& ctx, const CollectiveArgs& args);
void ring_barrier(RingContext& ctx);

// The same collectives on device memory (args.device >= 0), through staging
// memory (staged_ring.cc); barrier has no memory and runs ring_barrier.
void run_staged_collective(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm);

}  // namespace rr
