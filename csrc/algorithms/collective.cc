#include "algorithms/collective.h"

#include "algorithms/call_header.h"
#include "algorithms/ring_phases.h"

namespace rr {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

namespace {

std::string describe_arguments(const CollectiveArgs& args) {
  std::string s = collective_name(args.kind);
  switch (args.kind) {
    case CollectiveKind::kBarrier:
      return s + "()";
    case CollectiveKind::kAllGather:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ")";
    case CollectiveKind::kBroadcast:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) +
             ", root=" + std::to_string(args.root) + ")";
    default:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ", " +
             op_name(args.op) + ")";
  }
}

void run_host_collective(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      if (algorithm == Algorithm::kSmall) {
        small_all_reduce(ctx, args);
      } else {
        ring_all_reduce(ctx, args);
      }
      break;
    case CollectiveKind::kReduceScatter: ring_reduce_scatter(ctx, args); break;
    case CollectiveKind::kAllGather: ring_all_gather(ctx, args); break;
    case CollectiveKind::kBroadcast: ring_broadcast(ctx, args); break;
    case CollectiveKind::kBarrier: ring_barrier(ctx); break;
  }
}

}  // namespace

Algorithm choose_algorithm(const RingContext& ctx, const CollectiveArgs& args) {
  // Small messages are bound by latency, not bandwidth: N-1 steps beat
  // 2(N-1), even though each step carries the whole vector. The choice must
  // not depend on where the buffers live: host and GPU ranks meet in one call.
  const size_t bytes = args.count * dtype_size(args.dtype);
  const bool small = args.kind == CollectiveKind::kAllReduce && ctx.transport.size() > 1 &&
                     bytes <= ctx.small_bytes;
  return small ? Algorithm::kSmall : Algorithm::kRing;
}

std::string describe_call(const CollectiveArgs& args) {
  if (args.device < 0) return describe_arguments(args);
  return describe_arguments(args) + " on cuda:" + std::to_string(args.device);
}

void run_collective(RingContext& ctx, const CollectiveArgs& args) {
  // With one rank there is nothing to agree on and nobody to talk to.
  std::unique_ptr<CallHeader> header;
  RequestPtr header_sent;
  const Algorithm algorithm = choose_algorithm(ctx, args);
  if (ctx.transport.size() > 1) {
    header_sent = exchange_call_headers(ctx, args, algorithm, header);
  }
  if (args.device >= 0) {
    run_staged_collective(ctx, args, algorithm);
  } else {
    run_host_collective(ctx, args, algorithm);
  }
  // The header went out ahead of the data on the same link; `header` must
  // outlive its send.
  if (header_sent) ctx.transport.wait(*header_sent, ctx.deadline());
}

}  // namespace rr
