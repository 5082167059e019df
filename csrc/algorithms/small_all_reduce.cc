// all_reduce for small messages, where latency, not bandwidth, sets the time.
//
// The ring takes 2(N-1) dependent steps. Here every rank's whole vector goes
// once around the ring (N-1 steps, (N-1) x S bytes sent per rank, which for
// small S costs less than the steps saved), then every rank reduces the N
// vectors locally in rank order 0, 1, ..., N-1. The same operations in the
// same order give every rank the same bits, as the ring does.
#include "algorithms/schedule.h"

namespace rr {

void small_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  if (bytes == 0) return;

  // One slot of scratch per rank; ours is filled first, the all-gather fills
  // the rest.
  char* slots = x.scratch();
  x.copy(slots + ring.rank * bytes, args.send, bytes);
  all_gather_phase(x, ring, slots, args.count * ring.size, elem);

  char* out = static_cast<char*>(args.recv);
  x.reduce(out, slots, slots + bytes, args.count);
  for (int r = 2; r < ring.size; ++r) x.reduce(out, out, slots + r * bytes, args.count);
  if (args.op == ReduceOp::kAvg) x.divide(out, args.count, ring.size);
}

}  // namespace rr
