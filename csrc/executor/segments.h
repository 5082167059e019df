// How a step's region is cut into messages. Every executor cuts a step the
// same way (so ranks whose buffers live in different kinds of memory can run
// one collective together), and a schedule cuts its scratch and its pieces by
// the same rule (algorithms/ring_schedule.h).
#pragma once

#include <algorithm>
#include <cstddef>

namespace rr {

// The segment size for elements of `elem` bytes: a whole number of elements,
// at least one, so a reduction never splits an element across messages.
inline size_t segment_size(size_t segment_bytes, size_t elem) {
  return std::max<size_t>(1, segment_bytes / elem) * elem;
}

// Number of messages `bytes` are sent as. An empty region is not sent at all
// (zero messages), by either side.
inline size_t segments_in(size_t bytes, size_t segment) { return (bytes + segment - 1) / segment; }

// Length of segment j of a region of `bytes`.
inline size_t segment_length(size_t bytes, size_t segment, size_t j) {
  return std::min(segment, bytes - j * segment);
}

}  // namespace rr
