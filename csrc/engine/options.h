// A communicator's settings, read once at the edge (ringreduce.init reads the
// arguments and the RINGREDUCE_* environment, python/ringreduce/_env.py) and
// passed down as values: the engine reads no environment of its own. The
// defaults here are the only ones; Python reads them from a default-made
// _core.Options().
#pragma once

#include <cstddef>
#include <string>

namespace rr {

struct Options {
  double timeout_seconds = 60.0;  // every wait gives up after this long without progress
  // The message size of every step (RINGREDUCE_SEGMENT_BYTES): large enough to
  // amortize per-message overhead, small enough that reducing one segment
  // overlaps the arrival of the next and that the segments in flight stay in
  // the cache (shared-memory slots, TCP receive buffers). Measured side by side
  // with MPI_Allreduce and Gloo (README, Performance), 128 KiB beat 1 MiB on
  // shared memory at every size from 1 MB and matched it over TCP.
  size_t segment_bytes = 128 << 10;
  // all_reduce up to this many bytes at 2 ranks (scaled by 2/N) skips the
  // ring for a latency path (RINGREDUCE_SMALL_BYTES).
  size_t small_bytes = 64 << 10;
  // How all_reduce picks its algorithm: "auto", "ring" or "hierarchical"
  // (RINGREDUCE_ALGORITHM; see AlgorithmPolicy in algorithms/collective.h).
  std::string algorithm = "auto";
  // Which links: "tcp" or "mpi" (every link), "shm" (every rank on one host),
  // "auto" (shared memory between ranks of one host, the network transport
  // between hosts).
  std::string transport = "auto";
  std::string host_id;  // which host this is (RINGREDUCE_HOST_ID); empty: host_identity()
  long spin_us = 50;    // spinning before a wait sleeps (RINGREDUCE_SPIN_US)
  // Device arrays: the most bytes one copy between the GPU and the pinned
  // staging memory moves (RINGREDUCE_DEVICE_STAGING_BYTES; at least a
  // segment). Each copy, and each wait for one, costs microseconds of launch
  // and completion latency that a segment-sized copy does not amortize.
  size_t device_staging_bytes = 4 << 20;
  // Device arrays over shared memory: copy segments between the GPU and the
  // inboxes' slots directly, page-locked for it, instead of through the pinned
  // staging memory (RINGREDUCE_DEVICE_IN_PLACE=1; executor/device_executor.h,
  // "landing in place"). No host copy, but a copy, and a wait for it, per
  // segment: off until a GPU has measured it, since on ranks that time-slice
  // one GPU each such wait cost a time slice (the per-segment staging was 4x
  // slower than batches, docs/cuda.md).
  bool device_land_in_place = false;
  // Host reductions out of place: a step that reduces at least this many
  // bytes into the output writes it with streaming (non-temporal) stores, which
  // skip reading the output's lines into the cache before overwriting them
  // (RINGREDUCE_STREAM_STORE_BYTES; 0: never). Float32/float64 sums on x86-64 with AVX.
  // Measured at 2 ranks over shared memory (docs/performance.md): 64 MB
  // all_reduce 15% faster, while steps of 8 MB and less were slower with them
  // (their output is read again from the cache).
  size_t stream_store_bytes = 16 << 20;
  // Shared memory: messages from this size go by address, in one copy, where
  // the kernel allows cross-memory attach (RINGREDUCE_SHM_SINGLE_COPY_BYTES;
  // 0, the default, keeps every message in the slots: see shm_transport.h),
  // and the data bytes of one slot (RINGREDUCE_SHM_SLOT_BYTES; 0: the segment
  // size, so that every message fits one slot and is read where it lies).
  size_t shm_single_copy_bytes = 0;
  size_t shm_slot_bytes = 0;
  // The address peers reach our sockets at, data links and the MPI liveness
  // mesh alike (RINGREDUCE_SOCKET_ADDR); empty: the default route's interface.
  std::string socket_addr;
  // TCP connections (streams) per link into this rank, messages striped
  // across them (RINGREDUCE_TCP_STREAMS, 1..16); 0: from the NIC's speed
  // (default_tcp_streams in transport/tcp/tcp_transport.h).
  int tcp_streams = 0;
  // A TCP link whose peer's machine answers no keepalive probe for about this
  // many seconds fails, naming the peer (RINGREDUCE_TCP_KEEPALIVE; 0: off): a
  // partitioned or frozen host is named then, not at `timeout_seconds`. Only an
  // idle link is probed and a live peer's kernel answers even while the process
  // is stopped or busy, so a slow rank is not taken for a dead one. 15 s rides
  // out a link flap of a few seconds.
  int tcp_keepalive_seconds = 15;
  // The job's secret (RINGREDUCE_TOKEN / init(token=...)): every store
  // connection and data link proves it holds it; empty: no proof asked.
  std::string token;
  // Log to stderr, for every collective, which algorithm runs and why
  // (RINGREDUCE_DEBUG=algorithm).
  bool log_algorithm = false;
  bool fake_device = false;  // tests: the CPU stand-in for CUDA devices
  // Make the links for send/recv too (engine/p2p.h): shared memory on the
  // host, TCP connected on first use, a second MPI communicator.
  bool point_to_point = true;
};

}  // namespace rr
