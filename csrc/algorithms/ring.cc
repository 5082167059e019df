// Ring reduce-scatter and all-gather, and all_reduce as the two in sequence.
// Terms (chunk, step, segment) are defined in ring_schedule.h.
//
// Each rank sends 2(size-1)/size of the buffer in all_reduce: size-1 steps of
// one chunk in each phase. The reduce-scatter phase reads the input `src` and
// accumulates into `dst` (which may be the same buffer), so out-of-place calls
// need no extra copy of the input.
#include <algorithm>
#include <cstring>

#include "algorithms/call_header.h"
#include "algorithms/collective.h"
#include "algorithms/ring_phases.h"
#include "algorithms/ring_schedule.h"
#include "common/error.h"
#include "reduce/cpu_kernels.h"

namespace rr {
namespace {

struct Neighbours {
  int left;
  int right;
};

Neighbours neighbours(const Transport& t) {
  return {(t.rank() + t.size() - 1) % t.size(), (t.rank() + 1) % t.size()};
}

}  // namespace

void reduce_scatter_phase(RingContext& ctx, const char* src, char* dst, size_t count,
                          DataType dtype, ReduceOp op) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int rank = t.rank();
  const Neighbours nb = neighbours(t);
  const size_t elem = dtype_size(dtype);
  const ReduceFn reduce = cpu_reduce_fn(dtype, op);

  // Two segment buffers: one being received into while the other is reduced.
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / elem);
  const size_t seg_bytes = seg_elems * elem;
  if (ctx.scratch.size() < 2 * seg_bytes) ctx.scratch.resize(2 * seg_bytes);
  char* slot[2] = {ctx.scratch.data(), ctx.scratch.data() + seg_bytes};

  for (int step = 0; step < size - 1; ++step) {
    const RingStep s = reduce_scatter_step(rank, size, step);
    const auto [send_begin, send_end] = chunk_bounds(count, size, s.send_chunk);
    const auto [recv_begin, recv_end] = chunk_bounds(count, size, s.recv_chunk);

    // Step 0 sends our own contribution; later steps send the partial sum we
    // accumulated in the previous step.
    const char* send_base = step == 0 ? src : dst;
    RequestPtr send = t.isend(nb.right, send_base + send_begin * elem, (send_end - send_begin) * elem);

    const size_t recv_elems = recv_end - recv_begin;
    const size_t segments = segment_count(recv_elems * elem, seg_bytes);
    auto segment_len = [&](size_t j) { return std::min(seg_elems, recv_elems - j * seg_elems); };
    RequestPtr pending = t.irecv(nb.left, slot[0], segment_len(0) * elem);
    for (size_t j = 0; j < segments; ++j) {
      RequestPtr current = pending;
      if (j + 1 < segments) pending = t.irecv(nb.left, slot[(j + 1) % 2], segment_len(j + 1) * elem);
      t.wait(*current, ctx.deadline());
      const size_t offset = (recv_begin + j * seg_elems) * elem;
      reduce(dst + offset, src + offset, slot[j % 2], segment_len(j));
    }
    t.wait(*send, ctx.deadline());
  }
}

void all_gather_phase(RingContext& ctx, char* buffer, size_t count, size_t elem) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int rank = t.rank();
  const Neighbours nb = neighbours(t);
  for (int step = 0; step < size - 1; ++step) {
    const RingStep s = all_gather_step(rank, size, step);
    const auto [send_begin, send_end] = chunk_bounds(count, size, s.send_chunk);
    const auto [recv_begin, recv_end] = chunk_bounds(count, size, s.recv_chunk);
    // Chunks arrive straight into their final place: no scratch, no copy.
    RequestPtr send = t.isend(nb.right, buffer + send_begin * elem, (send_end - send_begin) * elem);
    RequestPtr recv = t.irecv(nb.left, buffer + recv_begin * elem, (recv_end - recv_begin) * elem);
    t.wait(*recv, ctx.deadline());
    t.wait(*send, ctx.deadline());
  }
}

void ring_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  char* dst = static_cast<char*>(args.recv);
  if (size == 1 || args.count == 0) {
    if (dst != src && args.count > 0) std::memmove(dst, src, args.count * elem);
    return;
  }
  reduce_scatter_phase(ctx, src, dst, args.count, args.dtype, args.op);
  if (args.op == ReduceOp::kAvg) {
    // Divide once, on the owner of each chunk, so every rank ends up with the
    // same bits after the all-gather.
    const auto [begin, end] = chunk_bounds(args.count, size, ctx.transport.rank());
    divide_by(args.dtype, dst + begin * elem, end - begin, size);
  }
  all_gather_phase(ctx, dst, args.count, elem);
}

void ring_reduce_scatter(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const auto [begin, end] = chunk_bounds(args.count, size, rank);
  const char* src = static_cast<const char*>(args.send);
  if (size == 1) {
    if (args.recv != args.send) std::memmove(args.recv, src, args.count * elem);
    return;
  }
  // The phase accumulates partial sums of other ranks' chunks in a buffer as
  // large as the input; only our own chunk is copied out.
  std::vector<char> work(args.count * elem);
  reduce_scatter_phase(ctx, src, work.data(), args.count, args.dtype, args.op);
  if (args.op == ReduceOp::kAvg) divide_by(args.dtype, work.data() + begin * elem, end - begin, size);
  std::memcpy(args.recv, work.data() + begin * elem, (end - begin) * elem);
}

void ring_all_gather(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  char* out = static_cast<char*>(args.recv);
  const size_t block_bytes = args.count * elem;
  // Our block goes to its place first; memmove allows the caller's input to
  // already sit there (in-place all_gather).
  if (out + rank * block_bytes != args.send && block_bytes > 0) {
    std::memmove(out + rank * block_bytes, args.send, block_bytes);
  }
  if (size == 1 || args.count == 0) return;
  all_gather_phase(ctx, out, args.count * size, elem);
}

}  // namespace rr
