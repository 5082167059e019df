// What a collective call is, independent of how it is run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/hierarchy.h"
#include "common/dtype.h"
#include "transport/transport.h"

namespace rr {

class Device;
class StreamMark;
class WindowRegistry;

// Numbering is part of the wire header: append only.
enum class CollectiveKind : uint8_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kReduce = 6,
  kGather = 7,
  kScatter = 8,
  kAllToAll = 9,
  // all_reduce and reduce_scatter with a codec (args.compression): the
  // one-hop schedule of algorithms/one_hop.cc, fewer bytes on the wire, sums
  // in float32.
  kCompressedAllReduce = 10,
  kCompressedReduceScatter = 11,
};
constexpr uint8_t kLastCollectiveKind = 11;
const char* collective_name(CollectiveKind kind);
inline bool compressed_kind(CollectiveKind kind) {
  return kind == CollectiveKind::kCompressedAllReduce ||
         kind == CollectiveKind::kCompressedReduceScatter;
}

// What a compressed call adds to its arguments (algorithms/one_hop.h).
struct Compression {
  // The codec: codec::CodecKind + 1 (bf16 1, fp16 2, int8 3, int4 4), or 0:
  // none, the call is exact (float32 rows; for a caller that sends an error-
  // feedback residual along with an exact sum). Part of the call header, so
  // ranks calling with different codecs get MismatchError.
  uint8_t codec = 0;
  // Error feedback: `count` float32 values added to the input before it is
  // encoded, left holding what the encodes dropped (null: none).
  float* residual = nullptr;
  // The call's number among the communicator's compressed calls, the same on
  // every rank: the seed of its stochastic rounding.
  uint64_t call = 0;
  // Chunks of at least twice this many values run in pieces of at least this
  // many, each piece's codec work overlapping another's exchange (0: whole).
  // The bits do not depend on it.
  size_t piece_values = 0;
  // The quality canary (compression/canary.py): `sample_count` indices into
  // the input, and `rows`: 2 x sample_count float32, this rank's input at
  // them, then zeros. The call writes its float32 sums (before avg) into the
  // second row where its own chunk holds them, gathers every rank's rows, and
  // measures the error of the sums against the exact ones (one_hop.h).
  const int64_t* sample = nullptr;
  size_t sample_count = 0;
  float* rows = nullptr;
  // The relative error past which the codec falls back: every later call of
  // this name on the communicator runs exact.
  double max_error = 0;
  // Set by the communicator, never by the caller: the codec fell back after a
  // canary, and the call runs exact (float32 rows, one-hop, no canary).
  bool exact = false;
  // The name the communicator counts the call's bytes and codec time under
  // (the codec's registry name: several may share one kernel).
  std::string name;
};

// What a compressed call reports of itself: the seconds of its codec work,
// and what its canary measured, if it ran one (compression/canary.py's
// measure: the relative L2 error of the sample's sums, and their bias
// relative to the RMS).
struct CompressedReport {
  double codec_seconds = 0;
  bool canary_ran = false;
  double canary_error = 0;
  double canary_bias = 0;
};

// One call. `count` is the number of elements of `send`: the whole vector for
// all_reduce/reduce_scatter/broadcast/reduce, one rank's block for
// all_gather/gather/scatter/all_to_all (scatter: of `recv`). Rooted calls
// (broadcast, reduce, gather, scatter) use `root`; only the root's `recv` of
// reduce and gather, and its `send` of scatter, is touched.
// `device` >= 0 says that send and recv are memory of that CUDA device, which
// the transport cannot touch: the call then runs on the device executor
// (executor/device_executor.h), after the work queued on the caller's
// `stream` before it. Host and device ranks can meet in one collective: the
// wire is the same.
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;  // all_reduce: count; reduce_scatter: own block; all_gather: size*count
  size_t count = 0;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int device = -1;
  uintptr_t stream = 0;  // a cudaStream_t; 0 is the legacy default stream
  // all_to_all with blocks that differ by peer (MPI_Alltoallv): element counts
  // and offsets by rank, into send and recv. Empty: every block is `count`
  // elements, block p at p x count.
  std::vector<size_t> send_counts, send_offsets, recv_counts, recv_offsets;
  // kCompressedAllReduce and kCompressedReduceScatter only.
  Compression compression;
};

// "all_reduce(count=10, float32, sum)": how errors name a call.
std::string describe_call(const CollectiveArgs& args);

// Which all_reduce algorithms the selection may pick (RINGREDUCE_ALGORITHM):
//   auto         - a latency path for small messages; above them hierarchical
//                  where there are several hosts with several ranks each (all
//                  the same number), else the ring;
//   ring         - the flat ring, at every size;
//   hierarchical - the hierarchical all_reduce at every size, where it can run
//                  (else the ring).
enum class AlgorithmPolicy : uint8_t { kAuto, kRing, kHierarchical };
// Throws InvalidArgument unless `name` is "auto", "ring" or "hierarchical".
AlgorithmPolicy parse_algorithm_policy(const std::string& name);

// The latency paths send N/2 times the ring's bytes or more, so their
// threshold shrinks as 2/N: `small_bytes` (Options) at 2 ranks, half that at
// 4; 0 at one rank. The all_reduce size up to which they run.
inline size_t small_message_bytes(size_t small_bytes, int size) {
  return size > 1 ? small_bytes * 2 / static_cast<size_t>(size) : 0;
}

// What a collective runs with, besides its arguments: the communicator's link
// to its peers and settings, and the memory it reuses from call to call.
struct RingContext {
  Transport& transport;
  double timeout_seconds;      // each wait gives up after this long without completing
  size_t segment_bytes;        // the message size of every step (1 B .. 1 GiB)
  uint64_t seq;                // the call's number on this communicator, from 1
  std::vector<char>& scratch;  // host scratch, reused between calls; grown on demand
  // all_reduce of at most this many bytes takes a latency path: kDirect when
  // the transport reaches every peer (shared memory), else kSmall.
  size_t small_bytes = 0;
  bool reaches_all = false;
  // For args.device >= 0: that device, and the caller's stream at submission.
  Device* device = nullptr;
  const StreamMark* device_mark = nullptr;
  size_t device_staging_bytes = 0;  // the most one staging copy moves (Options)
  bool device_land_in_place = false;  // Options::device_land_in_place
  // Out: of a staged device call, the bytes copied onto the device straight
  // out of the transport's memory (DeviceExecutor: landing in place).
  uint64_t staged_in_place_bytes = 0;
  size_t stream_store_bytes = 0;    // host steps from this size stream their output (Options)
  // Asked while waits run, when the caller can be interrupted (see Deadline).
  const Interrupt* interrupt = nullptr;
  // The groups of the hierarchical all_reduce; null or !usable() where it
  // cannot run (one host, one rank per host, hosts of different sizes).
  const Hierarchy* hierarchy = nullptr;
  // How all_reduce picks its algorithm (Options::algorithm).
  AlgorithmPolicy policy = AlgorithmPolicy::kAuto;
  // The issuing thread's tag (Communicator::set_issuer), sent in the header.
  uint64_t issuer = 0;
  // The communicator's windows (comm.empty); null where it makes none.
  const WindowRegistry* windows = nullptr;
  // What a compressed call reports (one_hop.h).
  CompressedReport compressed;

  Deadline deadline() const { return Deadline::after(timeout_seconds, interrupt); }
};

// How an all_reduce is run. Part of the call header, so ranks that would
// choose differently (a different RINGREDUCE_SMALL_BYTES) get MismatchError.
enum class Algorithm : uint8_t {
  kRing = 0,    // reduce-scatter + all-gather: 2(N-1)/N x S bytes, 2(N-1) steps
  kSmall = 1,   // all-gather whole vectors around the ring, reduce locally: N-1 steps
  kDirect = 2,  // every rank sends its vector to every other at once: 1 step
  // reduce-scatter on each host, all-reduce across hosts (one ring per local
  // rank), all-gather on each host: hierarchical.cc
  kHierarchical = 3,
  // every buffer in a window (comm.empty): each rank reduces its chunk out of
  // the peers' inputs in place and writes it into every output:
  // window_all_reduce.h
  kWindow = 4,
};
constexpr int kAlgorithms = 5;
const char* algorithm_name(Algorithm algorithm);

// Which algorithm and route a call takes, and running it: engine/choice.h and
// engine/dispatch.h.

}  // namespace rr
