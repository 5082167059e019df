// Ring reduce-scatter and all-gather, and the collectives built from them:
// all_reduce (the two in sequence), reduce_scatter and all_gather. Terms
// (chunk, step, segment, round) are defined in ring_schedule.h.
//
// Each rank sends 2(size-1)/size of the buffer in all_reduce: size-1 steps of
// one chunk in each phase. The reduce-scatter phase reads the input `src` and
// accumulates partial sums where the caller says (partial_sums), so an
// out-of-place all_reduce needs no copy of its input and a reduce_scatter
// needs no buffer the size of its input.
#include <functional>

#include "algorithms/ring_schedule.h"
#include "algorithms/schedule.h"

namespace rr {
namespace {

// Where reduce-scatter step `step` accumulates the piece that starts at
// element `begin`. The next step sends from there: the chunk sent in step
// t+1 is the one received in step t.
using PartialSums = std::function<char*(int step, size_t begin)>;

// The reduce-scatter phase over round `round` (pieces of `piece_elems` of
// every chunk). Afterwards partial(size-2, ...) holds this rank's piece of
// its own chunk, fully reduced, and divided by `divide_by` when it is > 1.
void reduce_scatter_phase(Executor& x, const Ring& ring, const char* src, size_t count, size_t elem,
                          size_t round, size_t piece_elems, const PartialSums& partial,
                          int divide_by) {
  for (int step = 0; step < ring.size - 1; ++step) {
    const RingStep s = reduce_scatter_step(ring.rank, ring.size, step);
    const auto [send_begin, send_end] =
        piece_bounds(count, ring.size, s.send_chunk, round, piece_elems);
    const auto [recv_begin, recv_end] =
        piece_bounds(count, ring.size, s.recv_chunk, round, piece_elems);
    StepPlan p = ring.plan();
    // Step 0 sends our own contribution; later steps the partial sum that the
    // previous step accumulated.
    p.send = step == 0 ? src + send_begin * elem : partial(step - 1, send_begin);
    p.send_bytes = (send_end - send_begin) * elem;
    p.recv = partial(step, recv_begin);
    p.recv_bytes = (recv_end - recv_begin) * elem;
    p.reduce_with = src + recv_begin * elem;
    if (step == ring.size - 2) p.divide_by = divide_by;
    x.step(p);
  }
}

// avg divides on the owner of each chunk only, as its last reduce-scatter
// step reduces it, so every rank ends up with the same bits after the
// all-gather.
int avg_divisor(const CollectiveArgs& args, const Ring& ring) {
  return args.op == ReduceOp::kAvg ? ring.size : 0;
}

}  // namespace

void all_gather_phase(Executor& x, const Ring& ring, char* buffer, size_t count, size_t elem) {
  for (int step = 0; step < ring.size - 1; ++step) {
    const RingStep s = all_gather_step(ring.rank, ring.size, step);
    const auto [send_begin, send_end] = chunk_bounds(count, ring.size, s.send_chunk);
    const auto [recv_begin, recv_end] = chunk_bounds(count, ring.size, s.recv_chunk);
    // Chunks arrive straight into their final place.
    StepPlan p = ring.plan();
    p.send = buffer + send_begin * elem;
    p.send_bytes = (send_end - send_begin) * elem;
    p.recv = buffer + recv_begin * elem;
    p.recv_bytes = (recv_end - recv_begin) * elem;
    x.step(p);
  }
}

void reduce_scatter_in_place(Executor& x, const Ring& ring, const char* src, char* dst,
                             size_t count, size_t elem, int divide_by) {
  // One round over whole chunks: the partial sums accumulate in place in dst,
  // at their own chunk's offset.
  const size_t whole_chunk = chunk_bounds(count, ring.size, 0).second;
  reduce_scatter_phase(
      x, ring, src, count, elem, 0, whole_chunk,
      [&](int, size_t begin) { return dst + begin * elem; }, divide_by);
}

void ring_all_reduce(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  char* dst = static_cast<char*>(args.recv);
  if (args.count == 0) return;
  if (ring.size == 1) {
    x.copy(dst, src, args.count * elem);
    return;
  }
  reduce_scatter_in_place(x, ring, src, dst, args.count, elem, avg_divisor(args, ring));
  all_gather_phase(x, ring, dst, args.count, elem);
}

void ring_reduce_scatter(Executor& x, const Ring& ring, const CollectiveArgs& args,
                         size_t piece_elems) {
  reduce_scatter_into(x, ring, args, piece_elems, static_cast<char*>(args.recv));
}

void reduce_scatter_into(Executor& x, const Ring& ring, const CollectiveArgs& args,
                         size_t piece_elems, char* out) {
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  if (args.count == 0) return;
  if (ring.size == 1) {
    x.copy(out, src, args.count * elem);
    return;
  }
  // Partial sums of other ranks' chunks live in two pieces of scratch,
  // alternating by step (each step sends one and fills the other); the last
  // step of a round accumulates our own piece straight into the output.
  const size_t own_begin = chunk_bounds(args.count, ring.size, ring.rank).first;
  char* scratch = x.scratch();
  const size_t piece_bytes = piece_elems * elem;
  const size_t rounds = round_count(args.count, ring.size, piece_elems);
  for (size_t round = 0; round < rounds; ++round) {
    reduce_scatter_phase(
        x, ring, src, args.count, elem, round, piece_elems,
        [&](int step, size_t begin) {
          return step == ring.size - 2 ? out + (begin - own_begin) * elem
                                       : scratch + (step % 2) * piece_bytes;
        },
        avg_divisor(args, ring));
  }
}

void ring_all_gather(Executor& x, const Ring& ring, const CollectiveArgs& args) {
  const size_t elem = dtype_size(args.dtype);
  char* out = static_cast<char*>(args.recv);
  const size_t block_bytes = args.count * elem;
  if (block_bytes == 0) return;
  // Our block goes to its place first, unless the caller's input already sits
  // there (in-place all_gather).
  x.copy(out + ring.rank * block_bytes, args.send, block_bytes);
  all_gather_phase(x, ring, out, args.count * ring.size, elem);
}

}  // namespace rr
