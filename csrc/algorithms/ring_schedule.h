// The pure arithmetic of the ring: which chunk goes where at each step.
// Kept apart from any I/O so it can be unit-tested on its own.
//
// Terms used throughout the ring code:
//   chunk   - the contiguous block of the flattened buffer that one rank owns at
//             the end of reduce-scatter. Chunks are balanced: the first
//             count % size ranks get one extra element (chunk_bounds).
//   step    - one exchange around the ring: every rank sends one chunk to its
//             right neighbour and receives one from its left. Each phase has
//             size - 1 steps.
//   segment - a chunk is cut into segments of at most segment_bytes for the
//             wire, so the reduction of one segment overlaps the arrival of the
//             next.
#pragma once

#include <cstddef>
#include <utility>

namespace rr {

// [begin, end) of chunk `index` when `count` elements are split over `parts`.
inline std::pair<size_t, size_t> chunk_bounds(size_t count, int parts, int index) {
  const size_t p = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  const size_t base = count / p;
  const size_t extra = count % p;
  const size_t begin = i * base + (i < extra ? i : extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

struct RingStep {
  int send_chunk;
  int recv_chunk;
};

inline int ring_mod(int value, int size) { return ((value % size) + size) % size; }

// Reduce-scatter, step s: rank r sends chunk r-s-1 (its partial sum of it) and
// receives chunk r-s-2 from its left neighbour. After size-1 steps, rank r holds
// the fully reduced chunk r, which is the block reduce_scatter returns.
inline RingStep reduce_scatter_step(int rank, int size, int step) {
  return {ring_mod(rank - step - 1, size), ring_mod(rank - step - 2, size)};
}

// All-gather, step s: rank r forwards chunk r-s (its own at step 0) and receives
// chunk r-s-1. After size-1 steps every rank holds every chunk.
inline RingStep all_gather_step(int rank, int size, int step) {
  return {ring_mod(rank - step, size), ring_mod(rank - step - 1, size)};
}

// Number of segments a chunk of `bytes` is cut into (at least one).
inline size_t segment_count(size_t bytes, size_t segment_bytes) {
  return bytes == 0 ? 1 : (bytes + segment_bytes - 1) / segment_bytes;
}

}  // namespace rr
