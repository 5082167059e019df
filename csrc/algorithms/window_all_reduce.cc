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

bool refused(uint64_t phase) { return (phase & Bulletin::kPhaseRefused) != 0; }

bool overlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

bool window_buffers(const RingContext& ctx, const CollectiveArgs& args) {
  if (ctx.windows == nullptr || !ctx.windows->any()) return false;
  const size_t bytes = args.count * dtype_size(args.dtype);
  const int size = ctx.transport.size();
  if (args.kind != CollectiveKind::kAllReduce || args.device >= 0 || size < 2 ||
      bytes <= window_min_bytes(size) || ctx.transport.bulletin() == nullptr) {
    return false;
  }
  if (args.send != args.recv && overlap(args.send, args.recv, bytes)) return false;
  return ctx.windows->find(args.send, bytes) && ctx.windows->find(args.recv, bytes);
}

namespace {

// Waits, as Bulletin::await_phase does, for every peer's phase to reach
// `value`, each wait with a deadline of its own (nothing else renews it).
void await_all(RingContext& ctx, Bulletin& bulletin, uint64_t value, const char* what) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    const uint64_t phase = bulletin.phase_of(peer);
    if (phase >= value && !refused(phase)) continue;
    bulletin.await_phase(
        peer, value,
        "rank " + std::to_string(peer) + " " + what + " in call #" + std::to_string(ctx.seq),
        ctx.deadline());
  }
}

// After a failure once peers may be writing into our output: says so (the
// refusal bit), then waits until each peer is done with our buffers (its
// phase reached `done`), refused or gone, at most the timeout and deaf to
// Ctrl-C, so that nothing writes into the caller's array after we return.
void settle(RingContext& ctx, Bulletin& bulletin, uint64_t done) noexcept {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  try {
    bulletin.raise_phase(Bulletin::kPhaseRefused | done);
  } catch (...) {
    return;  // closed: the peers see us gone
  }
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    try {
      bulletin.await_phase(peer, done, "rank " + std::to_string(peer) + " to leave our buffers",
                           Deadline::after(ctx.timeout_seconds));
    } catch (...) {
      // Refused, gone or timed out: it is not writing, or we cannot wait longer.
    }
  }
}

}  // namespace

void window_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  Bulletin& bulletin = *ctx.transport.bulletin();
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  const uint64_t seq = ctx.seq;
  // Our phase in this call: every peer located (nobody touches a rank's
  // buffers before it says so), then done with them all.
  const uint64_t located = 2 * seq - 1;
  const uint64_t done = 2 * seq;
  auto send = ctx.windows->find(args.send, bytes);
  auto recv = ctx.windows->find(args.recv, bytes);
  if (!send || !recv) throw Error("all_reduce: the window path's buffers left their windows");
  Entry mine{};
  mine.header = make_call_header(ctx, args, Algorithm::kWindow);
  mine.refs = {send->window->id(), send->offset, recv->window->id(), recv->offset};
  bulletin.publish(seq, &mine, sizeof mine, true, ctx.deadline());

  // Every rank's input and output, as mapped here.
  std::vector<const char*> in(static_cast<size_t>(size));
  std::vector<char*> out(static_cast<size_t>(size));
  std::vector<std::shared_ptr<SharedWindow>> held;  // their windows, alive for the call
  in[static_cast<size_t>(rank)] = static_cast<const char*>(args.send);
  out[static_cast<size_t>(rank)] = static_cast<char*>(args.recv);
  // Before we say `located`, a failure leaves nobody in our buffers: refusing
  // tells the peers at once.
  try {
    for (int i = 1; i < size; ++i) {
      const int peer = (rank + size - i) % size;
      Entry theirs{};
      try {
        bulletin.read(peer, seq, &theirs, sizeof theirs, ctx.deadline());
      } catch (const TimeoutError&) {
        never_started(ctx, args, peer);
      }
      check_call_header(theirs.header, mine.header, peer, rank);
      auto locate = [&](uint64_t id, uint64_t offset, const char* what) -> char* {
        std::shared_ptr<SharedWindow> w = ctx.windows->get(id);
        char* base = w ? w->peer_data(peer) : nullptr;
        if (base == nullptr) {
          throw Error("all_reduce: rank " + std::to_string(peer) + "'s " + what + " is in window " +
                      std::to_string(id) + ", which rank " + std::to_string(rank) +
                      " no longer holds (every rank must keep a window's array alive while any "
                      "rank uses it)");
        }
        if (offset > w->peer_bytes(peer) || bytes > w->peer_bytes(peer) - offset) {
          throw Error("all_reduce: rank " + std::to_string(peer) + "'s " + what +
                      " runs past the end of its window " + std::to_string(id));
        }
        held.push_back(w);
        return base + offset;
      };
      in[static_cast<size_t>(peer)] = locate(theirs.refs.send_id, theirs.refs.send_offset, "input");
      out[static_cast<size_t>(peer)] =
          locate(theirs.refs.recv_id, theirs.refs.recv_offset, "output");
    }
  } catch (...) {
    try {
      bulletin.raise_phase(Bulletin::kPhaseRefused | located);
    } catch (...) {
      // Closed: the peers see us gone.
    }
    throw;
  }

  try {
    bulletin.raise_phase(located);
    await_all(ctx, bulletin, located, "to find every rank's buffers");

    // Chunk r of the vector is rank r's: it reduces it block by block and
    // writes each block into every rank's output while it is in the cache.
    const size_t chunk = (args.count + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
    const size_t block = std::max<size_t>(1, kBlockBytes / elem);
    const size_t lo = std::min(args.count, chunk * static_cast<size_t>(rank));
    const size_t hi = std::min(args.count, lo + chunk);
    const ReduceFn reduce = cpu_reduce_fn(args.dtype, args.op);
    const bool in_place = args.send == args.recv;
    if (in_place && rank >= 2 && ctx.scratch.size() < block * elem) {
      ctx.scratch.resize(block * elem);
    }
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
      // Only this rank reads any rank's input in this chunk, and it is done
      // with this block: the outputs may take it even where they are inputs.
      for (int i = 1; i < size; ++i) {
        std::memcpy(out[static_cast<size_t>((rank + i) % size)] + off, o, n * elem);
      }
    }
    // Our chunk is in every output and we read no input any more. Once every
    // peer says the same, our output is whole and nobody touches our buffers.
    bulletin.raise_phase(done);
    await_all(ctx, bulletin, done, "to write its chunk into every output");
  } catch (...) {
    settle(ctx, bulletin, done);
    throw;
  }
}

}  // namespace rr
