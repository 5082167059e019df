// all_reduce across hosts with several ranks each, in three phases:
//   1. reduce-scatter on the host: the ring of the host's L ranks (shared
//      memory) leaves local rank l with chunk l of the host's sum;
//   2. all-reduce of that chunk across hosts: one ring per local index, of the
//      H ranks holding chunk l (one per host, in host order), so every rank
//      of a host drives the network at once, each with 1/L of the data;
//   3. all-gather on the host: every rank gets every chunk.
// Each rank sends 2(L-1)/L x S on its host and 2(H-1)/H x S/L to other
// hosts: 2(N-1)/N x S in all, as the flat ring, but a host's link carries
// 2(H-1)/H x S per direction instead of the flat ring's share of every
// crossing. Terms (chunk, step, segment) as in ring_schedule.h.
//
// Every element is reduced once, by one rank (the owner of its piece in
// phase 2), and copied from there, so every rank gets the same bits; avg
// divides there, by N, once.
#include "algorithms/hierarchy.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/schedule.h"

namespace rr {

void hierarchical_all_reduce(Executor& x, const Hierarchy& h, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  char* dst = static_cast<char*>(args.recv);
  if (args.count == 0) return;
  const Ring host{h.local_index, h.local_size(), &h.host_ranks};
  const Ring across{h.host_index, h.hosts(), &h.peers};

  // 1. The host's sum of our chunk lands in dst at its own offset.
  reduce_scatter_in_place(x, host, src, dst, args.count, elem);

  // 2. Our chunk, all-reduced across hosts in place. Every rank of this ring
  // has the same local index, so the same chunk: all skip an empty one.
  const auto [begin, end] = chunk_bounds(args.count, host.size, host.rank);
  const size_t n = end - begin;
  if (n > 0) {
    char* chunk = dst + begin * elem;
    // avg divides by everyone as the last step reduces our piece (with one
    // host there is no step: then afterwards).
    const int divisor = args.op == ReduceOp::kAvg ? host.size * across.size : 0;
    reduce_scatter_in_place(x, across, chunk, chunk, n, elem, across.size > 1 ? divisor : 0);
    const auto [piece_begin, piece_end] = chunk_bounds(n, across.size, across.rank);
    if (divisor > 1 && across.size == 1 && piece_end > piece_begin) {
      x.divide(chunk + piece_begin * elem, piece_end - piece_begin, divisor);
    }
    all_gather_phase(x, across, chunk, n, elem);
  }

  // 3. Every chunk to every rank of the host.
  all_gather_phase(x, host, dst, args.count, elem);
}

}  // namespace rr
