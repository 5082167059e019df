// The ring collectives on device memory (CUDA arrays): the schedule of
// ring.cc (ring_schedule.h), with every chunk moved through staging memory by
// the staged pipeline, one step at a time. Terms as in ring_schedule.h.
//
// What differs from the host ring is only where the bytes live: chunks are
// copied off the device segment by segment before they are sent, received
// segments are copied onto the device and reduced there by a kernel, and the
// few local copies (in-place placement, one rank) are device-to-device. The
// bytes on the wire are the same as the host ring's, so a host rank and a
// device rank can take part in one collective.
#include <algorithm>
#include <functional>

#include "algorithms/collective.h"
#include "algorithms/ring_phases.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/staged_pipeline.h"

namespace rr {
namespace {

// Where reduce-scatter step `step` accumulates the chunk starting at element
// `chunk_begin`. The next step sends from there (the chunk sent in step t+1
// is the one received in step t).
using PartialSums = std::function<char*(int step, size_t chunk_begin)>;

void staged_reduce_scatter_phase(RingContext& ctx, StagedPipeline& pipe, const char* src,
                                 size_t count, size_t elem, const PartialSums& partial) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  for (int step = 0; step < size - 1; ++step) {
    const RingStep s = reduce_scatter_step(rank, size, step);
    const auto [send_begin, send_end] = chunk_bounds(count, size, s.send_chunk);
    const auto [recv_begin, recv_end] = chunk_bounds(count, size, s.recv_chunk);
    StepPlan plan;
    // Step 0 sends our own contribution; later steps the partial sum the
    // previous step accumulated.
    plan.send = step == 0 ? src + send_begin * elem : partial(step - 1, send_begin);
    plan.send_bytes = (send_end - send_begin) * elem;
    plan.recv = partial(step, recv_begin);
    plan.recv_bytes = (recv_end - recv_begin) * elem;
    plan.reduce_with = src + recv_begin * elem;
    pipe.step(plan);
  }
}

void staged_all_gather_phase(RingContext& ctx, StagedPipeline& pipe, char* buffer, size_t count,
                             size_t elem) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  for (int step = 0; step < size - 1; ++step) {
    const RingStep s = all_gather_step(rank, size, step);
    const auto [send_begin, send_end] = chunk_bounds(count, size, s.send_chunk);
    const auto [recv_begin, recv_end] = chunk_bounds(count, size, s.recv_chunk);
    // Received chunks go straight to their final place on the device.
    StepPlan plan;
    plan.send = buffer + send_begin * elem;
    plan.send_bytes = (send_end - send_begin) * elem;
    plan.recv = buffer + recv_begin * elem;
    plan.recv_bytes = (recv_end - recv_begin) * elem;
    pipe.step(plan);
  }
}

// Divides on the owner of each chunk only, as the host ring does, so every
// rank ends up with the same bits.
void divide_own_chunk(StagedPipeline& pipe, const CollectiveArgs& args, char* chunk, size_t n,
                      int size) {
  if (args.op == ReduceOp::kAvg && n > 0) {
    pipe.device().divide(Lane::kToDevice, args.dtype, chunk, n, size);
  }
}

void staged_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  char* dst = static_cast<char*>(args.recv);
  if (args.count == 0) return;
  StagedPipeline pipe(ctx, args.dtype, args.op, 0);
  if (size == 1) {
    if (dst != src) pipe.device().copy(Lane::kToDevice, dst, src, args.count * elem);
    pipe.finish();
    return;
  }
  // Partial sums accumulate in place in dst, at their own chunk's offset.
  staged_reduce_scatter_phase(ctx, pipe, src, args.count, elem,
                              [&](int, size_t chunk_begin) { return dst + chunk_begin * elem; });
  const auto [begin, end] = chunk_bounds(args.count, size, ctx.transport.rank());
  divide_own_chunk(pipe, args, dst + begin * elem, end - begin, size);
  staged_all_gather_phase(ctx, pipe, dst, args.count, elem);
  pipe.finish();
}

// The small-message path of small_all_reduce.cc on device memory: whole
// vectors go around the ring into device scratch, then the GPU reduces them
// in rank order 0..N-1, the same order as on a host rank.
void staged_small_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  if (bytes == 0) return;
  StagedPipeline pipe(ctx, args.dtype, args.op, size * bytes);
  Device& device = pipe.device();
  char* slots = pipe.scratch();
  char* out = static_cast<char*>(args.recv);
  device.copy(Lane::kToDevice, slots + ctx.transport.rank() * bytes, args.send, bytes);
  staged_all_gather_phase(ctx, pipe, slots, args.count * size, elem);
  device.reduce(Lane::kToDevice, args.dtype, args.op, out, slots, slots + bytes, args.count);
  for (int r = 2; r < size; ++r) {
    device.reduce(Lane::kToDevice, args.dtype, args.op, out, out, slots + r * bytes, args.count);
  }
  if (args.op == ReduceOp::kAvg) {
    device.divide(Lane::kToDevice, args.dtype, out, args.count, size);
  }
  pipe.finish();
}

void staged_reduce_scatter(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const size_t elem = dtype_size(args.dtype);
  const char* src = static_cast<const char*>(args.send);
  char* out = static_cast<char*>(args.recv);
  if (args.count == 0) return;
  // Partial sums of other ranks' chunks live in two chunk-sized scratch
  // buffers, alternating by step (each step sends one and fills the other);
  // the last step accumulates our own chunk straight into the output. Two
  // chunks of device memory instead of the whole vector the host ring uses.
  const size_t max_chunk_bytes = (chunk_bounds(args.count, size, 0).second) * elem;
  StagedPipeline pipe(ctx, args.dtype, args.op, size > 2 ? 2 * max_chunk_bytes : 0);
  if (size == 1) {
    if (out != src) pipe.device().copy(Lane::kToDevice, out, src, args.count * elem);
    pipe.finish();
    return;
  }
  char* scratch = pipe.scratch();
  staged_reduce_scatter_phase(ctx, pipe, src, args.count, elem, [&](int step, size_t) {
    return step == size - 2 ? out : scratch + (step % 2) * max_chunk_bytes;
  });
  const auto [begin, end] = chunk_bounds(args.count, size, ctx.transport.rank());
  divide_own_chunk(pipe, args, out, end - begin, size);
  pipe.finish();
}

void staged_all_gather(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  char* out = static_cast<char*>(args.recv);
  const size_t block_bytes = args.count * elem;
  if (block_bytes == 0) return;
  StagedPipeline pipe(ctx, args.dtype, args.op, 0);
  // Our block goes to its place first, unless the caller's input already sits
  // there (in-place all_gather).
  if (out + rank * block_bytes != args.send) {
    pipe.device().copy(Lane::kToDevice, out + rank * block_bytes, args.send, block_bytes);
  }
  if (size > 1) staged_all_gather_phase(ctx, pipe, out, args.count * size, elem);
  pipe.finish();
}

// The root streams the buffer to the right; every other rank lands each
// segment on its device and forwards it from the staging slot it arrived in,
// unless its right neighbour is the root.
void staged_broadcast(RingContext& ctx, const CollectiveArgs& args) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (size == 1 || bytes == 0) return;
  StagedPipeline pipe(ctx, args.dtype, args.op, 0);
  StepPlan plan;
  if (rank == args.root) {
    plan.send = static_cast<const char*>(args.recv);
    plan.send_bytes = bytes;
  } else {
    plan.recv = static_cast<char*>(args.recv);
    plan.recv_bytes = bytes;
    plan.forward = (rank + 1) % size != args.root;
  }
  pipe.step(plan);
  pipe.finish();
}

}  // namespace

void run_staged_collective(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      if (algorithm == Algorithm::kSmall) {
        staged_small_all_reduce(ctx, args);
      } else {
        staged_all_reduce(ctx, args);
      }
      break;
    case CollectiveKind::kReduceScatter:
      staged_reduce_scatter(ctx, args);
      break;
    case CollectiveKind::kAllGather:
      staged_all_gather(ctx, args);
      break;
    case CollectiveKind::kBroadcast:
      staged_broadcast(ctx, args);
      break;
    case CollectiveKind::kBarrier:
      ring_barrier(ctx);
      break;
  }
}

}  // namespace rr
