// all_reduce for small messages, where latency, not bandwidth, sets the time.
//
// The ring takes 2(N-1) dependent steps. Here every rank gets every rank's
// whole vector ((N-1) x S bytes received per rank, which for small S costs
// less than the steps saved), then reduces the N vectors locally in rank
// order 0, 1, ..., N-1. The same operations in the same order give every rank
// the same bits, as the ring does. Two ways to gather the vectors:
//   small  - around the ring, N-1 steps: over links to ring neighbours only;
//   direct - from every rank at once, one step: where every peer is reached
//            directly (shared memory), N-1 messages in flight together.
#include <vector>

#include "algorithms/schedule.h"

namespace rr {

namespace {

// Reduces the N vectors in `slots` (one per rank, in rank order) into out.
void reduce_in_rank_order(Executor& x, const Ring& ring, const CollectiveArgs& args,
                          const char* slots, size_t bytes) {
  char* out = static_cast<char*>(args.recv);
  x.reduce(out, slots, slots + bytes, args.count);
  for (int r = 2; r < ring.size; ++r) x.reduce(out, out, slots + r * bytes, args.count);
  if (args.op == ReduceOp::kAvg) x.divide(out, args.count, ring.size);
}

}  // namespace

void small_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  if (bytes == 0) return;
  // One slot of scratch per rank; ours is filled first, the all-gather fills
  // the rest.
  char* slots = x.scratch();
  x.copy(slots + ring.rank * bytes, args.send, bytes);
  all_gather_phase(x, ring, slots, args.count * ring.size, elem);
  reduce_in_rank_order(x, ring, args, slots, bytes);
}

void direct_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (bytes == 0) return;
  // The executor's direct route addresses transport ranks: only for a ring of
  // every rank (a sub-ring's positions are other ranks).
  if (ring.members == nullptr &&
      x.direct_reduce(ring.rank, ring.size, args.send, args.recv, args.count)) {
    if (args.op == ReduceOp::kAvg) x.divide(args.recv, args.count, ring.size);
    return;
  }
  char* slots = x.scratch();
  char* mine = slots + ring.rank * bytes;
  x.copy(mine, args.send, bytes);
  // Step i pairs us with the ranks i places to each side: every rank sends
  // to and receives from every other, all at once.
  std::vector<StepPlan> plans(static_cast<size_t>(ring.size - 1));
  for (int i = 1; i < ring.size; ++i) {
    StepPlan& p = plans[static_cast<size_t>(i - 1)];
    p.send_to = (ring.rank + i) % ring.size;
    p.send = mine;
    p.send_bytes = bytes;
    p.recv_from = (ring.rank + ring.size - i) % ring.size;
    p.recv = slots + static_cast<size_t>(p.recv_from) * bytes;
    p.recv_bytes = bytes;
  }
  x.exchange(plans);
  reduce_in_rank_order(x, ring, args, slots, bytes);
}

}  // namespace rr
