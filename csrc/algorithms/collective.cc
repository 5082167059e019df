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

void run_host_collective(RingContext& ctx, const CollectiveArgs& args) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce: ring_all_reduce(ctx, args); break;
    case CollectiveKind::kReduceScatter: ring_reduce_scatter(ctx, args); break;
    case CollectiveKind::kAllGather: ring_all_gather(ctx, args); break;
    case CollectiveKind::kBroadcast: ring_broadcast(ctx, args); break;
    case CollectiveKind::kBarrier: ring_barrier(ctx); break;
  }
}

}  // namespace

std::string describe_call(const CollectiveArgs& args) {
  if (args.device < 0) return describe_arguments(args);
  return describe_arguments(args) + " on cuda:" + std::to_string(args.device);
}

void run_collective(RingContext& ctx, const CollectiveArgs& args) {
  // With one rank there is nothing to agree on and nobody to talk to.
  std::unique_ptr<CallHeader> header;
  RequestPtr header_sent;
  if (ctx.transport.size() > 1) header_sent = exchange_call_headers(ctx, args, header);
  if (args.device >= 0) {
    run_staged_collective(ctx, args);
  } else {
    run_host_collective(ctx, args);
  }
  // The header went out ahead of the data on the same link; `header` must
  // outlive its send.
  if (header_sent) ctx.transport.wait(*header_sent, ctx.deadline());
}

}  // namespace rr
