// Broadcast and barrier on the ring.
#include "algorithms/schedule.h"

namespace rr {

// The root streams the buffer to its right neighbour; every other rank
// forwards each segment as soon as it has arrived, unless its right neighbour
// is the root. Segments keep the pipeline full: the last rank finishes about
// one segment-time after the root, not size-1 buffer-times.
void ring_broadcast(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (ring.size == 1 || bytes == 0) return;
  char* data = static_cast<char*>(args.recv);
  StepPlan p = ring.plan();
  if (ring.rank == args.root) {
    p.send = data;
    p.send_bytes = bytes;
  } else {
    p.recv = data;
    p.recv_bytes = bytes;
    p.forward = ring.right() != args.root;
  }
  x.step(p);
}

// The call-header exchange that precedes every collective is itself the first
// round of a token ring. After size-1 rounds each rank has heard, directly or
// through its left neighbours, from every rank, so all of them have arrived.
// The token is one byte of scratch; the executor is asked for two.
void ring_barrier(Executor& x, const Ring& ring) {
  char* token = x.scratch();
  for (int round = 1; round < ring.size - 1; ++round) {
    StepPlan p = ring.plan();
    p.send = token;
    p.send_bytes = 1;
    p.recv = token + 1;
    p.recv_bytes = 1;
    x.step(p);
  }
}

}  // namespace rr
