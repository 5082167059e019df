// The pure arithmetic of the ring: which chunk goes where at each step, and
// how a step is cut into messages. Kept apart from any I/O so it can be
// unit-tested on its own (tests/test_schedule.py simulates the whole ring).
//
// Terms used throughout the ring code:
//   chunk   - the contiguous block of the flattened buffer that one rank owns at
//             the end of reduce-scatter. Chunks are balanced: the first
//             count % size ranks get one extra element (chunk_bounds).
//   step    - one exchange around the ring: every rank sends one chunk to its
//             right neighbour and receives one from its left. Each phase has
//             size - 1 steps.
//   segment - a step's data is cut into segments of at most segment_bytes, and
//             each segment is one message on the wire. Both ends of a link cut
//             the same way (segment_length), so no transport reassembles a
//             stream, and the reduction of one segment overlaps the arrival of
//             the next.
//   round   - reduce_scatter keeps its partial sums in a few segments of
//             scratch instead of a chunk-sized buffer, so it runs the ring
//             once per piece: round k moves piece k (piece_bounds) of every
//             chunk.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "executor/segments.h"  // segment_size, segments_in, segment_length

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

// Number of rounds reduce_scatter runs with pieces of `piece_elems` elements:
// enough for the largest chunk (chunk 0), at least one.
inline size_t round_count(size_t count, int parts, size_t piece_elems) {
  const size_t largest = chunk_bounds(count, parts, 0).second;
  return std::max<size_t>(1, (largest + piece_elems - 1) / piece_elems);
}

// [begin, end) of the piece of chunk `index` that round `round` moves; empty
// once the chunk is used up (chunks differ by at most one element, so only the
// last round can be empty for some chunks and not others).
inline std::pair<size_t, size_t> piece_bounds(size_t count, int parts, int index, size_t round,
                                              size_t piece_elems) {
  const auto [begin, end] = chunk_bounds(count, parts, index);
  const size_t piece_begin = std::min(end, begin + round * piece_elems);
  return {piece_begin, std::min(end, piece_begin + piece_elems)};
}

}  // namespace rr
