// all_reduce for small messages, where latency, not bandwidth, sets the time.
//
// The ring takes 2(N-1) dependent steps. Here every rank's whole vector goes
// once around the ring (N-1 steps, (N-1) x S bytes sent per rank, which for
// small S costs less than the steps saved), then every rank reduces the N
// vectors locally in rank order 0, 1, ..., N-1. The same operations in the
// same order give every rank the same bits, as the ring does.
#include <cstring>

#include "algorithms/collective.h"
#include "algorithms/ring_phases.h"
#include "reduce/cpu_kernels.h"

namespace rr {

void small_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  if (bytes == 0) return;

  // One slot per rank; ours is filled first, the all-gather fills the rest.
  if (ctx.scratch.size() < size * bytes) ctx.scratch.resize(size * bytes);
  char* slots = ctx.scratch.data();
  std::memcpy(slots + rank * bytes, args.send, bytes);
  all_gather_phase(ctx, slots, args.count * size, elem);

  const ReduceFn reduce = cpu_reduce_fn(args.dtype, args.op);
  char* out = static_cast<char*>(args.recv);
  reduce(out, slots, slots + bytes, args.count);
  for (int r = 2; r < size; ++r) reduce(out, out, slots + r * bytes, args.count);
  if (args.op == ReduceOp::kAvg) divide_by(args.dtype, out, args.count, size);
}

}  // namespace rr
