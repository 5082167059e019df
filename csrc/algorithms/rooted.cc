// Collectives with a root, and all_to_all: where data goes to or comes from
// one particular rank, or every rank has something different for every other.
// They talk to any peer, not only ring neighbours (transports connect such
// links on first use), with all messages of a call in flight at once.
//
//   reduce     - the ring's reduce-scatter (each rank ends with its chunk of
//                the result: (N-1)/N x S bytes sent per rank), then every
//                rank sends its chunk to the root: the root receives
//                (N-1)/N x S, half of what all_reduce moves, and the others
//                only their chunk.
//   gather     - every rank sends its block to the root.
//   scatter    - the root sends every rank its block.
//   all_to_all - every rank sends block p to rank p; blocks may differ in size
//                by pair (their sizes were checked before: call_header.h).
#include <utility>
#include <vector>

#include "algorithms/ring_schedule.h"
#include "algorithms/schedule.h"

namespace rr {

namespace {

// The root's side of a rooted collective: one step per other rank r, all in
// flight at once, receiving into (recv_base) or sending from (send_base) the
// region that `region(r)` gives as (byte offset, bytes).
template <typename Region>
void root_exchange(Executor& x, const Ring& ring, char* recv_base, const char* send_base,
                   Region region) {
  std::vector<StepPlan> plans;
  for (int r = 0; r < ring.size; ++r) {
    if (r == ring.rank) continue;
    const auto [offset, bytes] = region(r);
    StepPlan p;
    if (recv_base != nullptr) {
      p.recv_from = r;
      p.recv = recv_base + offset;
      p.recv_bytes = bytes;
    } else {
      p.send_to = r;
      p.send = send_base + offset;
      p.send_bytes = bytes;
    }
    plans.push_back(p);
  }
  x.exchange(plans);
}

}  // namespace

void ring_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args, size_t piece_elems) {
  const size_t elem = dtype_size(args.dtype);
  if (args.count == 0) return;
  if (ring.size == 1) {
    x.copy(args.recv, args.send, args.count * elem);
    return;
  }
  const bool root = ring.rank == args.root;
  auto at = [&](int r) { return chunk_bounds(args.count, ring.size, r); };
  // The root reduces its own chunk straight into its place in the result;
  // the others into scratch, after the reduce-scatter's two pieces.
  char* out = root ? static_cast<char*>(args.recv) + at(ring.rank).first * elem
                   : x.scratch() + (ring.size > 2 ? 2 * piece_elems * elem : 0);
  reduce_scatter_into(x, ring, args, piece_elems, out);
  if (!root) {
    StepPlan p;
    p.send_to = args.root;
    p.send = out;
    p.send_bytes = (at(ring.rank).second - at(ring.rank).first) * elem;
    x.step(p);
    return;
  }
  root_exchange(x, ring, static_cast<char*>(args.recv), nullptr, [&](int r) {
    return std::pair<size_t, size_t>{at(r).first * elem, (at(r).second - at(r).first) * elem};
  });
}

void direct_gather(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t block = args.count * dtype_size(args.dtype);
  if (block == 0) return;
  if (ring.rank != args.root) {
    StepPlan p;
    p.send_to = args.root;
    p.send = static_cast<const char*>(args.send);
    p.send_bytes = block;
    x.step(p);
    return;
  }
  char* out = static_cast<char*>(args.recv);
  x.copy(out + ring.rank * block, args.send, block);
  root_exchange(x, ring, out, nullptr, [&](int r) {
    return std::pair<size_t, size_t>{static_cast<size_t>(r) * block, block};
  });
}

void direct_scatter(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t block = args.count * dtype_size(args.dtype);
  if (block == 0) return;
  if (ring.rank != args.root) {
    StepPlan p;
    p.recv_from = args.root;
    p.recv = static_cast<char*>(args.recv);
    p.recv_bytes = block;
    x.step(p);
    return;
  }
  const char* in = static_cast<const char*>(args.send);
  x.copy(args.recv, in + ring.rank * block, block);
  root_exchange(x, ring, nullptr, in, [&](int r) {
    return std::pair<size_t, size_t>{static_cast<size_t>(r) * block, block};
  });
}

void direct_all_to_all(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  const bool uneven = !args.send_counts.empty();
  auto block = [&](const std::vector<size_t>& counts, const std::vector<size_t>& offsets,
                   int r) -> std::pair<size_t, size_t> {  // (offset, bytes)
    const auto i = static_cast<size_t>(r);
    if (!uneven) return {i * args.count * elem, args.count * elem};
    return {offsets[i] * elem, counts[i] * elem};
  };
  const char* in = static_cast<const char*>(args.send);
  char* out = static_cast<char*>(args.recv);
  const auto [mine_in, mine_bytes] = block(args.send_counts, args.send_offsets, ring.rank);
  const auto [mine_out, mine_out_bytes] = block(args.recv_counts, args.recv_offsets, ring.rank);
  (void)mine_out_bytes;  // equal to mine_bytes: checked with the block sizes
  if (mine_bytes > 0) x.copy(out + mine_out, in + mine_in, mine_bytes);
  // Step i pairs us with the ranks i places to each side, as direct_all_reduce.
  std::vector<StepPlan> plans;
  for (int i = 1; i < ring.size; ++i) {
    StepPlan p;
    p.send_to = (ring.rank + i) % ring.size;
    p.recv_from = (ring.rank + ring.size - i) % ring.size;
    const auto [send_at, send_bytes] = block(args.send_counts, args.send_offsets, p.send_to);
    const auto [recv_at, recv_bytes] = block(args.recv_counts, args.recv_offsets, p.recv_from);
    p.send = in + send_at;
    p.send_bytes = send_bytes;
    p.recv = out + recv_at;
    p.recv_bytes = recv_bytes;
    plans.push_back(p);
  }
  x.exchange(plans);
}

}  // namespace rr
