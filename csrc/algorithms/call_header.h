// The always-on consistency check. Before any data, every rank sends its right
// neighbour a 40-byte header describing the call it is making, and compares
// the header from its left neighbour with its own. Around the ring this
// compares every rank with every other, for 40 bytes per call. A mismatch
// raises MismatchError naming both ranks and both calls, instead of a hang or
// silently wrong data. The header also carries which of the program's threads
// issued the call (a tag the caller sets), so that calls two threads issue in
// different orders on different ranks cannot pair up unnoticed.
#pragma once

#include <cstdint>
#include <memory>

#include "algorithms/collective.h"
#include "transport/bulletin.h"

namespace rr {

constexpr uint32_t kCallHeaderMagic = 0x52524331;  // "RRC1"

struct CallHeader {
  uint32_t magic;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t algorithm;
  uint64_t seq;
  uint64_t count;
  int32_t root;
  // The message size the ranks cut steps into (RINGREDUCE_SEGMENT_BYTES):
  // ranks that cut differently would misread each other's messages.
  uint32_t segment_bytes;
  // The issuing thread's tag (Communicator::set_issuer; 0 when not told).
  uint64_t issuer;
};
static_assert(sizeof(CallHeader) == 40, "the header is part of the wire format");

// Raises MismatchError naming both ranks and calls unless the left
// neighbour's header `theirs` (any 40 bytes off the wire) matches ours. When
// the issuers differ, the message says "was issued by another thread" and
// gives each rank's tag as "rank R (issuer tag 0x<16 hex digits>)" (the Python
// layer names the threads from them).
void check_call_header(const CallHeader& theirs, const CallHeader& mine, int left, int rank);

// This call's header, as check_call_header compares it.
CallHeader make_call_header(const RingContext& ctx, const CollectiveArgs& args,
                            Algorithm algorithm);

// The header exchange of one call: sends our header right and posts the
// receive of the left neighbour's when made; check() waits for it and
// compares (MismatchError, or TimeoutError naming the neighbour that never
// started the call).
//
// Where the transport has a bulletin (transport/bulletin.h) the header is published
// there instead, read by the right neighbour: no message at all.
class HeaderExchange {
 public:
  HeaderExchange(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm);
  void check();
  // Waits until our header has left (the call's end; it must outlive its send).
  void finish();

 private:
  RingContext& ctx_;
  const CollectiveArgs& args_;
  CallHeader mine_;
  CallHeader theirs_{};
  Bulletin* bulletin_;
  RequestPtr sent_;
  RequestPtr received_;
  bool checked_ = false;
};

// A peer's header did not come within the timeout: it never started this call,
// which is the useful fact (TimeoutError naming it).
[[noreturn]] void never_started(const RingContext& ctx, const CollectiveArgs& args, int peer);

// all_to_all: before any block, every pair of ranks compares the size of the
// block one sends the other with the size the other expects (8 bytes each
// way), so uneven blocks that disagree raise MismatchError naming both ranks
// instead of misreading the stream.
void exchange_block_sizes(RingContext& ctx, const CollectiveArgs& args);

}  // namespace rr
