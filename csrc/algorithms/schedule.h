// Every collective's schedule, written once over an Executor
// (executor/executor.h), whatever memory its buffers live in. A schedule
// issues steps (who sends which region to whom, who receives and reduces
// what) built from the pure helpers of ring_schedule.h, and a few local
// operations; the executor moves the bytes.
#pragma once

#include <cstddef>

#include "algorithms/collective.h"
#include "executor/executor.h"

namespace rr {

// This rank's place on the ring.
struct Ring {
  int rank;
  int size;

  int left() const { return (rank + size - 1) % size; }
  int right() const { return (rank + 1) % size; }
  // A step that sends right and receives from the left, as every ring step does.
  StepPlan plan() const {
    StepPlan p;
    p.send_to = right();
    p.recv_from = left();
    return p;
  }
};

// The scratch memory `args` needs from the executor (in the buffers' kind of
// memory): a few segments at most for large calls.
size_t scratch_bytes(const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                     size_t segment_bytes);

// Issues every step and operation of the collective; the caller then calls
// x.finish().
void run_schedule(Executor& x, const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                  size_t segment_bytes);

// The schedules, one per collective (and algorithm).
void ring_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void small_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void direct_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void ring_reduce_scatter(Executor& x, const Ring& ring, const CollectiveArgs& args,
                         size_t piece_elems);
void ring_all_gather(Executor& x, const Ring& ring, const CollectiveArgs& args);
void ring_broadcast(Executor& x, const Ring& ring, const CollectiveArgs& args);
void ring_barrier(Executor& x, const Ring& ring);
void ring_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args, size_t piece_elems);
void direct_gather(Executor& x, const Ring& ring, const CollectiveArgs& args);
void direct_scatter(Executor& x, const Ring& ring, const CollectiveArgs& args);
void direct_all_to_all(Executor& x, const Ring& ring, const CollectiveArgs& args);

// The reduce-scatter phases of ring_reduce_scatter, writing this rank's
// reduced chunk to `out` (whose scratch starts at x.scratch()).
void reduce_scatter_into(Executor& x, const Ring& ring, const CollectiveArgs& args,
                         size_t piece_elems, char* out);

// The all-gather phase over `count` elements of `elem` bytes, in place in
// `buffer`: this rank's chunk must be there; afterwards every chunk is.
void all_gather_phase(Executor& x, const Ring& ring, char* buffer, size_t count, size_t elem);

}  // namespace rr
