// The compressed all_reduce and reduce_scatter (CollectiveKind::kCompressed*):
// the one-hop schedule, written once over an Executor whose CodecOps run the
// codec where the buffers live (docs/compression.md; the Python reference of
// the same bits is python/ringreduce/_comm/compressed/hop.py).
//
// Terms: chunk k is chunk_bounds(count, N, k) of the input, owned by rank k;
// a row is one codec payload as it travels, padded to 8 bytes.
//
//   1. scatter: every rank encodes every chunk but its own (input plus the
//      error-feedback residual, which keeps what the encode dropped) and sends
//      chunk k to rank k; the owner adds the N-1 payloads to its own chunk,
//      never encoded, in float32: each contribution is quantized once.
//   2. gather (all_reduce): the owner encodes its sum once (its residual keeps
//      that error) and sends it to every rank; every rank decodes all N rows,
//      so every rank ends with the same bits.
//
// Each rank sends 2(N-1)/N of the payload, as the ring would. Chunks of at
// least twice `piece_values` run in pieces: piece p+1's encode and piece p-1's
// decode run while piece p's rows travel. Pieces start at block boundaries and
// each is encoded at its index in the chunk with the chunk's seed, so the bits
// do not depend on how a call is cut.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/collective.h"
#include "algorithms/schedule.h"

namespace rr {

// The phases of a call, in its seeds.
enum class HopPhase : uint32_t { kWorker = 1, kOwner = 2 };

// The 64-bit stochastic-rounding key of one encode: `rank` encoding `chunk`
// in `phase` of compressed call `call`; the same as compressed/hop.py's
// seed_key(seed(call, phase, rank, chunk)).
uint64_t one_hop_key(uint64_t call, HopPhase phase, int rank, int chunk);

// How many pieces a call of these arguments runs in, on `size` ranks (1: whole).
size_t one_hop_pieces(const CollectiveArgs& args, int size);

// The scratch the schedule needs from the executor: rows, the owner's sum,
// and float32 copies of 16-bit input and output.
size_t one_hop_scratch_bytes(const CollectiveArgs& args, int size);

// Runs the call; the seconds of codec work (encodes, decodes, conversions)
// are added to *codec_seconds. Throws InvalidArgument where the executor has
// no codec operations.
void one_hop(Executor& x, const Ring& ring, const CollectiveArgs& args, CompressedReport* report);

}  // namespace rr
