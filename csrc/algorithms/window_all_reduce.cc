#include "algorithms/window_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/call_header.h"
#include "common/error.h"
#include "reduce/cpu_kernels.h"
#include "transport/shm/shm_window.h"

namespace rr {

namespace {

// Where a rank's buffers lie in its windows: the rest of its bulletin entry.
struct WindowRefs {
  uint64_t send_id, send_offset, recv_id, recv_offset;
};
struct Entry {
  CallHeader header;
  WindowRefs refs;
};
static_assert(sizeof(Entry) <= Bulletin::kEntryBytes, "one bulletin entry");

// A chunk is reduced and handed out a block at a time, so that the copies into
// the peers' outputs read it from the cache.
constexpr size_t kBlockBytes = 64 << 10;

bool overlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

bool window_buffers(const RingContext& ctx, const CollectiveArgs& args) {
  if (ctx.windows == nullptr || !ctx.windows->any()) return false;
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (args.kind != CollectiveKind::kAllReduce || args.device >= 0 || bytes <= kBulletinDataBytes ||
      ctx.transport.size() < 2 || ctx.transport.bulletin() == nullptr) {
    return false;
  }
  if (args.send != args.recv && overlap(args.send, args.recv, bytes)) return false;
  return ctx.windows->find(args.send, bytes) && ctx.windows->find(args.recv, bytes);
}

void window_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  Bulletin& bulletin = *ctx.transport.bulletin();
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  const Deadline deadline = ctx.deadline();
  const uint64_t seq = ctx.seq;
  auto send = ctx.windows->find(args.send, bytes);
  auto recv = ctx.windows->find(args.recv, bytes);
  if (!send || !recv) throw Error("all_reduce: the window path's buffers left their windows");
  Entry mine{};
  mine.header = make_call_header(ctx, args, Algorithm::kWindow);
  mine.refs = {send->window->id(), send->offset, recv->window->id(), recv->offset};
  bulletin.publish(seq, &mine, sizeof mine, true, deadline);

  // Every rank's input and output, as mapped here.
  std::vector<const char*> in(static_cast<size_t>(size));
  std::vector<char*> out(static_cast<size_t>(size));
  std::vector<std::shared_ptr<SharedWindow>> held;  // their windows, alive for the call
  in[static_cast<size_t>(rank)] = static_cast<const char*>(args.send);
  out[static_cast<size_t>(rank)] = static_cast<char*>(args.recv);
  auto refuse = [&](const std::string& why) {
    bulletin.raise_phase(Bulletin::kPhaseRefused | seq);
    throw Error("all_reduce: " + why);
  };
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + size - i) % size;
    Entry theirs{};
    try {
      bulletin.read(peer, seq, &theirs, sizeof theirs, deadline);
    } catch (const TimeoutError&) {
      throw TimeoutError("rank " + std::to_string(peer) + " did not start " + describe_call(args) +
                             " (call #" + std::to_string(seq) + ") within " +
                             format_seconds(ctx.timeout_seconds) + " s; rank " +
                             std::to_string(rank) + " waited for it",
                         peer);
    }
    try {
      check_call_header(theirs.header, mine.header, peer, rank);
    } catch (...) {
      bulletin.raise_phase(Bulletin::kPhaseRefused | seq);
      throw;
    }
    auto locate = [&](uint64_t id, uint64_t offset, const char* what) -> char* {
      std::shared_ptr<SharedWindow> w = ctx.windows->get(id);
      char* base = w ? w->peer_data(peer) : nullptr;
      if (base == nullptr) {
        refuse("rank " + std::to_string(peer) + "'s " + what + " is in window " +
               std::to_string(id) + ", which rank " + std::to_string(rank) +
               " no longer holds (every rank must keep a window's array alive while any "
               "rank uses it)");
      }
      if (offset > w->peer_bytes(peer) || bytes > w->peer_bytes(peer) - offset) {
        refuse("rank " + std::to_string(peer) + "'s " + what + " runs past the end of its window " +
               std::to_string(id));
      }
      held.push_back(w);
      return base + offset;
    };
    in[static_cast<size_t>(peer)] = locate(theirs.refs.send_id, theirs.refs.send_offset, "input");
    out[static_cast<size_t>(peer)] = locate(theirs.refs.recv_id, theirs.refs.recv_offset, "output");
  }

  // Chunk r of the vector is rank r's: it reduces it block by block and writes
  // each block into every rank's output while it is in the cache.
  const size_t chunk = (args.count + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
  const size_t block = std::max<size_t>(1, kBlockBytes / elem);
  const size_t lo = std::min(args.count, chunk * static_cast<size_t>(rank));
  const size_t hi = std::min(args.count, lo + chunk);
  const ReduceFn reduce = cpu_reduce_fn(args.dtype, args.op);
  const bool in_place = args.send == args.recv;
  if (in_place && rank >= 2 && ctx.scratch.size() < block * elem) ctx.scratch.resize(block * elem);
  for (size_t at = lo; at < hi; at += block) {
    const size_t n = std::min(hi, at + block) - at;
    const size_t off = at * elem;
    char* o = out[static_cast<size_t>(rank)] + off;
    // In place, a rank past the first two would overwrite its input before
    // adding it: it sums all but the last input in scratch.
    char* acc = in_place && rank >= 2 ? ctx.scratch.data() : o;
    reduce(acc, in[0] + off, in[1] + off, n);
    for (int r = 2; r < size - 1; ++r) reduce(acc, acc, in[static_cast<size_t>(r)] + off, n);
    if (size > 2) reduce(o, acc, in[static_cast<size_t>(size - 1)] + off, n);
    if (args.op == ReduceOp::kAvg) divide_by(args.dtype, o, n, size);
    // Only this rank reads any rank's input in this chunk, and it is done with
    // this block: the peers' outputs may take it even where they are their inputs.
    for (int i = 1; i < size; ++i) {
      std::memcpy(out[static_cast<size_t>((rank + i) % size)] + off, o, n * elem);
    }
  }
  // Done: our chunk is in every output, and we read no input any more. Once
  // every peer says the same, our output is whole and nobody reads our input.
  bulletin.raise_phase(seq);
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    const uint64_t v = bulletin.phase_of(peer);
    if (v >= seq && (v & Bulletin::kPhaseRefused) == 0) continue;
    bulletin.await_phase(peer, seq,
                         "rank " + std::to_string(peer) + " to write its chunk of call #" +
                             std::to_string(seq) + " into rank " + std::to_string(rank) +
                             "'s output",
                         deadline);
  }
}

}  // namespace rr
