#include "algorithms/call_header.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "algorithms/one_hop.h"
#include "common/error.h"

namespace rr {
namespace {

constexpr uint32_t kHeaderMagic = kCallHeaderMagic;

}  // namespace

CallHeader make_call_header(const RingContext& ctx, const CollectiveArgs& args,
                            Algorithm algorithm) {
  CallHeader h{};
  h.magic = kHeaderMagic;
  h.kind = static_cast<uint8_t>(args.kind);
  h.dtype = static_cast<uint8_t>(args.dtype);
  h.op = static_cast<uint8_t>(args.op);
  h.algorithm = static_cast<uint8_t>(algorithm);
  h.seq = ctx.seq;
  // all_to_all's blocks may differ by pair: exchange_block_sizes checks them.
  h.count = args.kind == CollectiveKind::kAllToAll && !args.send_counts.empty() ? 0 : args.count;
  // Compressed calls have no root: the field carries the codec, and the
  // number of pieces the call is cut into (ranks that cut differently would
  // misread each other's rows).
  h.root = compressed_kind(args.kind)
               ? static_cast<int32_t>(args.compression.codec |
                                      one_hop_pieces(args, ctx.transport.size()) << 8)
               : args.root;
  h.segment_bytes = static_cast<uint32_t>(ctx.segment_bytes);
  h.issuer = ctx.issuer;
  return h;
}

namespace {

// Renders a header the way the user wrote the call.
std::string describe_header(const CallHeader& h) {
  const bool known =
      h.kind >= 1 && h.kind <= kLastCollectiveKind && valid_dtype(h.dtype) && valid_op(h.op);
  if (!known) return "an unknown call (corrupt header)";
  CollectiveArgs args;
  args.kind = static_cast<CollectiveKind>(h.kind);
  args.count = h.count;
  args.dtype = static_cast<DataType>(h.dtype);
  args.op = static_cast<ReduceOp>(h.op);
  args.root = h.root;
  std::string pieces;
  if (compressed_kind(args.kind)) {
    args.root = 0;
    args.compression.codec = static_cast<uint8_t>(h.root & 0xff);
    const int cut = h.root >> 8;
    if (cut > 1) pieces = " in " + std::to_string(cut) + " pieces";
  }
  const char* path =
      h.algorithm == static_cast<uint8_t>(Algorithm::kSmall)    ? " (small-message path)"
      : h.algorithm == static_cast<uint8_t>(Algorithm::kDirect) ? " (direct small-message path)"
      : h.algorithm == static_cast<uint8_t>(Algorithm::kHierarchical) ? " (hierarchical)"
      : h.algorithm == static_cast<uint8_t>(Algorithm::kWindow)
          ? " (window path: every buffer from comm.empty)"
          : "";
  return describe_call(args) + pieces + path + " as call #" + std::to_string(h.seq);
}

std::string issuer_tag(uint64_t tag) {
  char text[32];
  std::snprintf(text, sizeof text, "issuer tag 0x%016llx", static_cast<unsigned long long>(tag));
  return text;
}

}  // namespace

void check_call_header(const CallHeader& theirs, const CallHeader& mine, int left, int rank) {
  auto facts = [&](const char* reason) {
    MismatchFacts f;
    f.reason = reason;
    f.ranks[0] = left;
    f.ranks[1] = rank;
    f.calls[0] = describe_header(theirs);
    f.calls[1] = describe_header(mine);
    f.issuers[0] = theirs.magic == kHeaderMagic ? theirs.issuer : 0;
    f.issuers[1] = mine.issuer;
    return f;
  };
  if (theirs.magic == kHeaderMagic && theirs.segment_bytes != mine.segment_bytes) {
    throw MismatchError("ranks " + std::to_string(left) + " and " + std::to_string(rank) +
                            " cut messages differently: rank " + std::to_string(left) +
                            " uses segments of " + std::to_string(theirs.segment_bytes) +
                            " bytes, rank " + std::to_string(rank) + " of " +
                            std::to_string(mine.segment_bytes) +
                            " (set RINGREDUCE_SEGMENT_BYTES alike on every rank)",
                        left, facts("segments"));
  }
  if (theirs.magic == kHeaderMagic && theirs.issuer != mine.issuer && theirs.seq == mine.seq) {
    // Two threads of the program take turns on the communicator, in a
    // different order on the two ranks: the data would be the wrong thread's.
    throw MismatchError("call #" + std::to_string(mine.seq) +
                            " was issued by another thread on rank " + std::to_string(left) +
                            " than on rank " + std::to_string(rank) + ": rank " +
                            std::to_string(left) + " (" + issuer_tag(theirs.issuer) + ") called " +
                            describe_header(theirs) + ", rank " + std::to_string(rank) + " (" +
                            issuer_tag(mine.issuer) + ") called " + describe_header(mine),
                        left, facts("thread"));
  }
  if (theirs.magic != kHeaderMagic || theirs.kind != mine.kind || theirs.dtype != mine.dtype ||
      theirs.op != mine.op || theirs.algorithm != mine.algorithm || theirs.seq != mine.seq ||
      theirs.count != mine.count || theirs.root != mine.root) {
    throw MismatchError("collective mismatch between rank " + std::to_string(left) + " and rank " +
                            std::to_string(rank) + ": rank " + std::to_string(left) + " called " +
                            describe_header(theirs) + ", rank " + std::to_string(rank) +
                            " called " + describe_header(mine),
                        left, facts("call"));
  }
}

HeaderExchange::HeaderExchange(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm)
    : ctx_(ctx),
      args_(args),
      mine_(make_call_header(ctx, args, algorithm)),
      bulletin_(ctx.transport.bulletin()) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int rank = t.rank();
  if (bulletin_ != nullptr) {
    bulletin_->publish(ctx.seq, &mine_, sizeof mine_, false, ctx.deadline());
    return;
  }
  sent_ = t.isend((rank + 1) % size, &mine_, sizeof(CallHeader));
  received_ = t.irecv((rank + size - 1) % size, &theirs_, sizeof theirs_);
}

[[noreturn]] void never_started(const RingContext& ctx, const CollectiveArgs& args, int peer) {
  const int rank = ctx.transport.rank();
  throw TimeoutError("rank " + std::to_string(peer) + " did not start " + describe_call(args) +
                         " (call #" + std::to_string(ctx.seq) + ") within " +
                         format_seconds(ctx.timeout_seconds) + " s; rank " +
                         std::to_string(rank) + " waited for it",
                     peer);
}

void HeaderExchange::check() {
  if (checked_) return;
  checked_ = true;
  Transport& t = ctx_.transport;
  const int rank = t.rank();
  const int left = (rank + t.size() - 1) % t.size();
  try {
    if (bulletin_ != nullptr) {
      bulletin_->read(left, ctx_.seq, &theirs_, sizeof theirs_, ctx_.deadline());
    } else {
      t.wait(*received_, ctx_.deadline());
    }
  } catch (const TimeoutError&) {
    never_started(ctx_, args_, left);
  }
  check_call_header(theirs_, mine_, left, rank);
}

void HeaderExchange::finish() {
  if (sent_) ctx_.transport.wait(*sent_, ctx_.deadline());
}

void exchange_block_sizes(RingContext& ctx, const CollectiveArgs& args) {
  Transport& t = ctx.transport;
  const int size = t.size();
  const int rank = t.rank();
  const bool uneven = !args.send_counts.empty();
  std::vector<uint64_t> mine(static_cast<size_t>(size));
  std::vector<uint64_t> theirs(static_cast<size_t>(size));
  std::vector<RequestPtr> requests;
  for (int i = 1; i < size; ++i) {
    const int to = (rank + i) % size;
    const int from = (rank + size - i) % size;
    mine[static_cast<size_t>(to)] = uneven ? args.send_counts[static_cast<size_t>(to)] : args.count;
    requests.push_back(t.isend(to, &mine[static_cast<size_t>(to)], sizeof(uint64_t)));
    requests.push_back(t.irecv(from, &theirs[static_cast<size_t>(from)], sizeof(uint64_t)));
  }
  for (RequestPtr& r : requests) t.wait(*r, ctx.deadline());
  for (int from = 0; from < size; ++from) {
    if (from == rank) continue;
    const uint64_t expected = uneven ? args.recv_counts[static_cast<size_t>(from)] : args.count;
    if (theirs[static_cast<size_t>(from)] != expected) {
      MismatchFacts f;
      f.reason = "blocks";
      f.ranks[0] = from;
      f.ranks[1] = rank;
      f.calls[0] = "all_to_all sending " + std::to_string(theirs[static_cast<size_t>(from)]) +
                   " elements to rank " + std::to_string(rank);
      f.calls[1] = "all_to_all expecting " + std::to_string(expected) + " elements from rank " +
                   std::to_string(from);
      throw MismatchError("all_to_all: rank " + std::to_string(from) + " sends " +
                              std::to_string(theirs[static_cast<size_t>(from)]) +
                              " elements to rank " + std::to_string(rank) + ", which expects " +
                              std::to_string(expected) + " from it",
                          from, std::move(f));
    }
  }
}

}  // namespace rr
