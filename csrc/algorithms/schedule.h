// Every collective's schedule, written once over an Executor
// (executor/executor.h), whatever memory its buffers live in. A schedule
// issues steps (who sends which region to whom, who receives and reduces
// what) built from the pure helpers of ring_schedule.h, and a few local
// operations; the executor moves the bytes.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/collective.h"
#include "executor/executor.h"

namespace rr {

// This rank's place on the ring. A ring over some of the transport's ranks
// (hierarchical.cc) names them in `members`: ring position i is transport
// rank (*members)[i]; without it, position i is rank i.
struct Ring {
  int rank;
  int size;
  const std::vector<int>* members = nullptr;

  int left() const { return (rank + size - 1) % size; }
  int right() const { return (rank + 1) % size; }
  // The transport rank at ring position `position`.
  int peer(int position) const {
    return members != nullptr ? (*members)[static_cast<size_t>(position)] : position;
  }
  // A step that sends right and receives from the left, as every ring step does.
  StepPlan plan() const {
    StepPlan p;
    p.send_to = peer(right());
    p.recv_from = peer(left());
    return p;
  }
};

// The scratch memory `args` needs from the executor (in the buffers' kind of
// memory): a few segments at most for large calls.
size_t scratch_bytes(const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                     size_t segment_bytes);

// Issues every step and operation of the collective; the caller then calls
// x.finish().
// `hierarchy`: the groups of Algorithm::kHierarchical (null for the others).
// `report`: what a compressed call reports of itself (one_hop.h).
void run_schedule(Executor& x, const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                  size_t segment_bytes, const Hierarchy* hierarchy = nullptr,
                  CompressedReport* report = nullptr);

// The schedules, one per collective (and algorithm).
void ring_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void small_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void direct_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args);
void hierarchical_all_reduce(Executor& x, const Hierarchy& hierarchy, const CollectiveArgs& args);
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

// The reduce-scatter phase of all_reduce over `count` elements of `elem`
// bytes of `src`, in one round: partial sums accumulate in `dst` at their own
// chunk's offset (src may equal dst). Afterwards dst holds this rank's chunk,
// reduced over the ring and, when `divide_by` > 1, divided by it (as each
// segment is reduced); other chunks of dst hold partial sums.
void reduce_scatter_in_place(Executor& x, const Ring& ring, const char* src, char* dst,
                             size_t count, size_t elem, int divide_by = 0);

// The all-gather phase over `count` elements of `elem` bytes, in place in
// `buffer`: this rank's chunk must be there; afterwards every chunk is.
void all_gather_phase(Executor& x, const Ring& ring, char* buffer, size_t count, size_t elem);

}  // namespace rr
