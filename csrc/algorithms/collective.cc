#include "algorithms/collective.h"

#include <cmath>
#include <cstdio>
#include <optional>

#include "algorithms/call_header.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/schedule.h"
#include "algorithms/window_all_reduce.h"
#include "common/error.h"
#include "executor/device_executor.h"
#include "executor/host_executor.h"

namespace rr {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
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
    case CollectiveKind::kAllToAll:
      if (!args.send_counts.empty())
        return s + "(" + std::string(dtype_name(args.dtype)) + ", uneven)";
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ")";
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) +
             ", root=" + std::to_string(args.root) + ")";
    case CollectiveKind::kReduce:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ", " +
             op_name(args.op) + ", root=" + std::to_string(args.root) + ")";
    default:
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ", " +
             op_name(args.op) + ")";
  }
}

// reduce_scatter moves each chunk in pieces of this many segments, so that
// its partial sums need two pieces of scratch, not two chunks.
constexpr size_t kPieceSegments = 4;

size_t piece_elems(const CollectiveArgs& args, size_t segment_bytes) {
  const size_t elem = dtype_size(args.dtype);
  return kPieceSegments * segment_size(segment_bytes, elem) / elem;
}

}  // namespace

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kSmall:
      return "small";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kWindow:
      return "window";
  }
  return "?";
}

AlgorithmPolicy parse_algorithm_policy(const std::string& name) {
  if (name == "auto") return AlgorithmPolicy::kAuto;
  if (name == "ring") return AlgorithmPolicy::kRing;
  if (name == "hierarchical") return AlgorithmPolicy::kHierarchical;
  throw InvalidArgument(
      "the all_reduce algorithm must be 'auto', 'ring' or 'hierarchical' "
      "(RINGREDUCE_ALGORITHM), got '" +
      name + "'");
}

Algorithm choose_algorithm(const RingContext& ctx, const CollectiveArgs& args) {
  // Small messages are bound by latency, not bandwidth: fewer dependent steps
  // beat fewer bytes. Where every peer is reached directly (shared memory),
  // one step of N-1 messages; else N-1 steps around the ring. The choice must
  // not depend on where the buffers live: host and GPU ranks meet in one call.
  // Above them, where hosts are joined by a slower network than their ranks
  // share, the hierarchical all_reduce sends each host's data across once
  // per direction instead of once per crossing of the flat ring. Every rank
  // sees the same hosts (exchanged at rendezvous), so all choose alike.
  if (args.kind != CollectiveKind::kAllReduce || ctx.transport.size() == 1) {
    return Algorithm::kRing;
  }
  const bool hierarchical = ctx.hierarchy != nullptr && ctx.hierarchy->usable();
  switch (ctx.policy) {
    case AlgorithmPolicy::kRing:
      return Algorithm::kRing;
    case AlgorithmPolicy::kHierarchical:
      return hierarchical ? Algorithm::kHierarchical : Algorithm::kRing;
    case AlgorithmPolicy::kAuto:
      break;
  }
  // The one choice made from where the buffers live: a rank whose buffers are
  // not all in windows chooses otherwise, and the headers say so.
  if (window_buffers(ctx, args)) return Algorithm::kWindow;
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (bytes <= ctx.small_bytes) return ctx.reaches_all ? Algorithm::kDirect : Algorithm::kSmall;
  return hierarchical ? Algorithm::kHierarchical : Algorithm::kRing;
}

namespace {

std::string byte_count(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3 && std::fmod(v, 1024.0) == 0) {
    v /= 1024;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.0f %s", v, units[u]);
  return text;
}

// Why the hierarchical all_reduce can or cannot run on these ranks.
std::string hosts_sentence(const RingContext& ctx) {
  const Hierarchy* h = ctx.hierarchy;
  const std::string n = std::to_string(ctx.transport.size());
  if (h == nullptr || h->hosts() == 0) {
    // Hosts not compared (this rank alone on its host), or of different sizes.
    return "the hierarchical all_reduce cannot run on these " + n +
           " ranks (it needs several hosts with the same number of ranks, more than one, "
           "on each)";
  }
  if (h->hosts() == 1) return "all " + n + " ranks share one host";
  if (h->local_size() == 1) return "the " + n + " ranks are on " + n + " hosts, one rank each";
  return "the " + n + " ranks span " + std::to_string(h->hosts()) + " hosts of " +
         std::to_string(h->local_size()) + " ranks";
}

}  // namespace

std::string explain_algorithm(const RingContext& ctx, const CollectiveArgs& args) {
  const Algorithm chosen = choose_algorithm(ctx, args);
  const std::string name = algorithm_name(chosen);
  if (ctx.transport.size() == 1) return "one rank, nothing to exchange: " + name;
  if (args.kind != CollectiveKind::kAllReduce) {
    return std::string(collective_name(args.kind)) + " has one schedule, no choice to make";
  }
  const bool hierarchical = ctx.hierarchy != nullptr && ctx.hierarchy->usable();
  switch (ctx.policy) {
    case AlgorithmPolicy::kRing:
      return "RINGREDUCE_ALGORITHM=ring: " + name;
    case AlgorithmPolicy::kHierarchical:
      return hierarchical
                 ? "RINGREDUCE_ALGORITHM=hierarchical and " + hosts_sentence(ctx) + ": " + name
                 : "RINGREDUCE_ALGORITHM=hierarchical, but " + hosts_sentence(ctx) + ": " + name;
    case AlgorithmPolicy::kAuto:
      break;
  }
  if (chosen == Algorithm::kWindow) {
    return "every buffer of this rank is in a window (comm.empty) and all " +
           std::to_string(ctx.transport.size()) +
           " ranks share this host, so the ranks read each other's buffers in place: " + name;
  }
  const size_t bytes = args.count * dtype_size(args.dtype);
  const std::string limit = "the small-message limit of " + byte_count(ctx.small_bytes) + " at " +
                            std::to_string(ctx.transport.size()) +
                            " ranks (RINGREDUCE_SMALL_BYTES, scaled by 2/N)";
  if (bytes <= ctx.small_bytes) {
    return byte_count(bytes) + " <= " + limit + ", latency-bound; " +
           (ctx.reaches_all ? "every peer is one link away (shared memory), so one step: "
                            : "peers are reached around the ring, so N-1 steps of whole "
                              "vectors: ") +
           name;
  }
  return byte_count(bytes) + " > " + limit + ", bandwidth-bound; " + hosts_sentence(ctx) +
         (hierarchical ? ", so each host's data crosses the network once per direction: " : ": ") +
         name;
}

std::string describe_call(const CollectiveArgs& args) {
  if (args.device < 0) return describe_arguments(args);
  return describe_arguments(args) + " on cuda:" + std::to_string(args.device);
}

size_t scratch_bytes(const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                     size_t segment_bytes) {
  const size_t elem = dtype_size(args.dtype);
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      // The latency paths gather every rank's (small) vector before reducing.
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kHierarchical
                 ? 0
                 : ring.size * args.count * elem;
    case CollectiveKind::kReduceScatter:
      return ring.size > 2 ? 2 * piece_elems(args, segment_bytes) * elem : 0;
    case CollectiveKind::kReduce:
      // The reduce-scatter's pieces, then (off the root) this rank's chunk.
      return (ring.size > 2 ? 2 * piece_elems(args, segment_bytes) * elem : 0) +
             chunk_bounds(args.count, ring.size, 0).second * elem;
    case CollectiveKind::kBarrier:
      return 2;  // the token sent and the token received
    default:
      return 0;
  }
}

// The device executor's slot: `most`, or less for a call whose steps cannot
// fill kBatchesPerStep such slots (a step moves at most a buffer's bytes).
size_t staging_bytes(const Ring& ring, const CollectiveArgs& args, size_t most) {
  if (!args.send_counts.empty()) return most;
  const size_t buffer = args.count * dtype_size(args.dtype) * static_cast<size_t>(ring.size);
  return std::min(most, buffer / DeviceExecutor::kBatchesPerStep);
}

void run_schedule(Executor& x, const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                  size_t segment_bytes, const Hierarchy* hierarchy) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      switch (algorithm) {
        case Algorithm::kRing:
          ring_all_reduce(x, ring, args);
          break;
        case Algorithm::kSmall:
          small_all_reduce(x, ring, args);
          break;
        case Algorithm::kDirect:
          direct_all_reduce(x, ring, args);
          break;
        case Algorithm::kHierarchical:
          hierarchical_all_reduce(x, *hierarchy, args);
          break;
      }
      break;
    case CollectiveKind::kReduceScatter:
      ring_reduce_scatter(x, ring, args, piece_elems(args, segment_bytes));
      break;
    case CollectiveKind::kAllGather:
      ring_all_gather(x, ring, args);
      break;
    case CollectiveKind::kBroadcast:
      ring_broadcast(x, ring, args);
      break;
    case CollectiveKind::kBarrier:
      ring_barrier(x, ring);
      break;
    case CollectiveKind::kReduce:
      ring_reduce(x, ring, args, piece_elems(args, segment_bytes));
      break;
    case CollectiveKind::kGather:
      direct_gather(x, ring, args);
      break;
    case CollectiveKind::kScatter:
      direct_scatter(x, ring, args);
      break;
    case CollectiveKind::kAllToAll:
      direct_all_to_all(x, ring, args);
      break;
  }
}

namespace {

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

void run_collective(RingContext& ctx, const CollectiveArgs& args) {
  // With one rank there is nothing to agree on and nobody to talk to.
  std::optional<HeaderExchange> header;
  const Algorithm algorithm = choose_algorithm(ctx, args);
  if (ctx.transport.size() > 1) {
    check_links(ctx.transport, args);
    if (runs_on_bulletin(ctx, args, algorithm)) {
      bulletin_all_reduce(ctx, args, algorithm);
      return;
    }
    if (algorithm == Algorithm::kWindow) {
      window_all_reduce(ctx, args);
      return;
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
    DeviceExecutor x(setup, *ctx.device, *ctx.device_mark);
    run_schedule(x, ring, args, algorithm, ctx.segment_bytes, ctx.hierarchy);
    x.finish();
  } else {
    HostExecutor x(setup, ctx.scratch);
    run_schedule(x, ring, args, algorithm, ctx.segment_bytes, ctx.hierarchy);
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
