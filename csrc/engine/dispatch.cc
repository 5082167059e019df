#include "engine/dispatch.h"

#include <algorithm>
#include <optional>

#include "algorithms/bulletin_all_reduce.h"
#include "algorithms/call_header.h"
#include "algorithms/schedule.h"
#include "algorithms/window_all_reduce.h"
#include "common/error.h"
#include "executor/device_executor.h"
#include "executor/host_executor.h"

namespace rr {

namespace {

// The device executor's slot: `most`, or less for a call whose steps cannot
// fill kBatchesPerStep such slots (a step moves at most a buffer's bytes).
size_t staging_bytes(const Ring& ring, const CollectiveArgs& args, size_t most) {
  if (!args.send_counts.empty()) return most;
  const size_t buffer = args.count * dtype_size(args.dtype) * static_cast<size_t>(ring.size);
  return std::min(most, buffer / DeviceExecutor::kBatchesPerStep);
}

// Gather, scatter, reduce (its last step) and all_to_all talk to peers other
// than the ring neighbours; every transport can, but say so plainly if not.
void check_links(const Transport& t, const CollectiveArgs& args) {
  const bool any_peer =
      args.kind == CollectiveKind::kGather || args.kind == CollectiveKind::kScatter ||
      args.kind == CollectiveKind::kReduce || args.kind == CollectiveKind::kAllToAll;
  if (!any_peer) return;
  for (int peer = 0; peer < t.size(); ++peer) {
    const bool needed =
        args.kind == CollectiveKind::kAllToAll || t.rank() == args.root || peer == args.root;
    if (peer != t.rank() && needed && !t.connects(peer)) {
      throw Error(std::string(collective_name(args.kind)) + ": the " + t.name() +
                  " transport of rank " + std::to_string(t.rank()) + " cannot reach rank " +
                  std::to_string(peer));
    }
  }
}

}  // namespace

void dispatch(RingContext& ctx, const CollectiveArgs& args, const Choice& choice) {
  // With one rank there is nothing to agree on and nobody to talk to.
  std::optional<HeaderExchange> header;
  const Algorithm algorithm = choice.algorithm;
  if (ctx.transport.size() > 1) {
    check_links(ctx.transport, args);
    switch (choice.route) {
      case Route::kBulletin:
        bulletin_all_reduce(ctx, args, algorithm);
        return;
      case Route::kWindow:
        window_all_reduce(ctx, args);
        return;
      case Route::kSchedule:
        break;
    }
    header.emplace(ctx, args, algorithm);
    header->check();
    if (args.kind == CollectiveKind::kAllToAll && !args.send_counts.empty()) {
      exchange_block_sizes(ctx, args);
    }
  }
  const Ring ring{ctx.transport.rank(), ctx.transport.size()};
  ExecutorSetup setup{ctx.transport,     ctx.timeout_seconds,
                      ctx.segment_bytes, args.dtype,
                      args.op,           scratch_bytes(ring, args, algorithm, ctx.segment_bytes),
                      ctx.interrupt};
  setup.stream_store_bytes = ctx.stream_store_bytes;
  if (args.device >= 0) {
    setup.staging_bytes = staging_bytes(ring, args, ctx.device_staging_bytes);
    setup.land_in_place = ctx.device_land_in_place;
    DeviceExecutor x(setup, *ctx.device, *ctx.device_mark);
    run_schedule(x, ring, args, algorithm, ctx.segment_bytes, ctx.hierarchy, &ctx.compressed);
    x.finish();
    ctx.staged_in_place_bytes = x.in_place_bytes();
  } else {
    HostExecutor x(setup, ctx.scratch);
    run_schedule(x, ring, args, algorithm, ctx.segment_bytes, ctx.hierarchy, &ctx.compressed);
    x.finish();
  }
  if (header) {
    // The header went out ahead of the data on the same link; it must
    // outlive its send. (The direct algorithm needs no headers of its own
    // from every rank: the ring of checks already makes all ranks agree.)
    header->finish();
  }
}

}  // namespace rr
