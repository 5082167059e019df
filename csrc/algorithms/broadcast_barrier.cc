// Broadcast and barrier on the ring.
#include <algorithm>

#include "algorithms/collective.h"
#include "algorithms/ring_phases.h"
#include "algorithms/ring_schedule.h"

namespace rr {

// The root streams the buffer to its right neighbour; every other rank
// forwards each segment as soon as it has arrived, unless its right neighbour
// is the root. Segments keep the pipeline full: the last rank finishes about
// one segment-time after the root, not size-1 buffer-times.
void ring_broadcast(RingContext& ctx, const CollectiveArgs& args) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int rank = t.rank();
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (size == 1 || bytes == 0) return;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  char* data = static_cast<char*>(args.recv);

  if (rank == args.root) {
    RequestPtr send = t.isend(right, data, bytes);
    t.wait(*send, ctx.deadline());
    return;
  }
  const size_t seg = std::max<size_t>(1, ctx.segment_bytes);
  const size_t segments = segment_count(bytes, seg);
  std::vector<RequestPtr> recvs;
  std::vector<RequestPtr> sends;
  recvs.reserve(segments);
  for (size_t j = 0; j < segments; ++j) {
    recvs.push_back(t.irecv(left, data + j * seg, std::min(seg, bytes - j * seg)));
  }
  const bool forward = right != args.root;
  for (size_t j = 0; j < segments; ++j) {
    t.wait(*recvs[j], ctx.deadline());
    if (forward) sends.push_back(t.isend(right, data + j * seg, std::min(seg, bytes - j * seg)));
  }
  for (auto& s : sends) t.wait(*s, ctx.deadline());
}

// The call-header exchange that precedes every collective is itself the first
// round of a token ring. After size-1 rounds each rank has heard, directly or
// through its left neighbours, from every rank, so all of them have arrived.
void ring_barrier(RingContext& ctx) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int right = (t.rank() + 1) % size;
  const int left = (t.rank() + size - 1) % size;
  for (int round = 1; round < size - 1; ++round) {
    char out = 1;
    char in = 0;
    RequestPtr send = t.isend(right, &out, 1);
    RequestPtr recv = t.irecv(left, &in, 1);
    t.wait(*recv, ctx.deadline());
    t.wait(*send, ctx.deadline());
  }
}

}  // namespace rr
