#include "algorithms/collective.h"

#include "algorithms/one_hop.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/schedule.h"
#include "common/error.h"

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
    case CollectiveKind::kCompressedAllReduce:
      return "all_reduce";
    case CollectiveKind::kCompressedReduceScatter:
      return "reduce_scatter";
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
    case CollectiveKind::kCompressedAllReduce:
    case CollectiveKind::kCompressedReduceScatter: {
      const uint8_t codec = args.compression.codec;
      const std::string name = codec == 0 ? "exact"
                               : codec <= 4
                                   ? codec::codec_name(static_cast<codec::CodecKind>(codec - 1))
                                   : "codec #" + std::to_string(codec);
      return s + "(count=" + std::to_string(args.count) + ", " + dtype_name(args.dtype) + ", " +
             op_name(args.op) + ", compression=" + name + ")";
    }
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
    case CollectiveKind::kCompressedAllReduce:
    case CollectiveKind::kCompressedReduceScatter:
      return one_hop_scratch_bytes(args, ring.size);
    default:
      return 0;
  }
}

void run_schedule(Executor& x, const Ring& ring, const CollectiveArgs& args, Algorithm algorithm,
                  size_t segment_bytes, const Hierarchy* hierarchy, CompressedReport* report) {
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
    case CollectiveKind::kCompressedAllReduce:
    case CollectiveKind::kCompressedReduceScatter: {
      CompressedReport unused;
      one_hop(x, ring, args, report != nullptr ? report : &unused);
      break;
    }
  }
}

}  // namespace rr
