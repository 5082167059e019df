#include "algorithms/window_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/call_header.h"
#include "common/error.h"
#include "executor/device.h"
#include "reduce/cpu_kernels.h"
#include "transport/shm/shm_window.h"

namespace rr {

namespace {

// Where a rank's buffers lie in its windows: the rest of its bulletin entry.
struct WindowRefs {
  uint64_t send_id, send_offset, recv_id, recv_offset;
  int64_t device;  // -1: host windows; else the CUDA device of the rank's windows
};
struct Entry {
  CallHeader header;
  WindowRefs refs;
};
static_assert(sizeof(Entry) <= Bulletin::kEntryBytes, "one bulletin entry");

// A chunk is reduced and handed out a block at a time, so that the copies into
// the peers' outputs read it from the cache.
constexpr size_t kBlockBytes = 64 << 10;

// The device's events this path records (executor/device.h).
constexpr int kCallerReady = 0;
constexpr int kChunkDone = 1;

bool refused(uint64_t phase) { return (phase & Bulletin::kPhaseRefused) != 0; }

bool overlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

// window_buffers()'s verdict, with the first reason it found against the path.
enum class WindowFit {
  kFits,
  kNoWindows,   // this communicator has no window (or not an all_reduce, or one rank)
  kNotOneHost,  // the transport has no bulletin over every rank
  kSmall,       // host windows at or below window_min_bytes
  kOverlap,     // input and output overlap without being the same memory
  kManyRanks,   // device windows on more ranks than one kernel takes
  kOutside,     // input or output not wholly inside one window of this device
};

WindowFit window_fit(const RingContext& ctx, const CollectiveArgs& args) {
  if (ctx.windows == nullptr || !ctx.windows->any()) return WindowFit::kNoWindows;
  const size_t bytes = args.count * dtype_size(args.dtype);
  const int size = ctx.transport.size();
  if (args.kind != CollectiveKind::kAllReduce || size < 2) return WindowFit::kNoWindows;
  if (ctx.transport.bulletin() == nullptr) return WindowFit::kNotOneHost;
  // Device windows at every size: any other path stages through the host.
  if (args.device < 0 && bytes <= window_min_bytes(size)) return WindowFit::kSmall;
  if (bytes == 0) return WindowFit::kNoWindows;
  if (args.send != args.recv && overlap(args.send, args.recv, bytes)) return WindowFit::kOverlap;
  // One kernel reads every rank's input: beyond the addresses it can take,
  // device buffers are staged.
  if (args.device >= 0 && size > Device::kMaxReduceAll) return WindowFit::kManyRanks;
  const auto send = ctx.windows->find(args.send, bytes);
  const auto recv = ctx.windows->find(args.recv, bytes);
  const bool inside = send && recv && send->window->device() == args.device &&
                      recv->window->device() == args.device;
  return inside ? WindowFit::kFits : WindowFit::kOutside;
}

}  // namespace

bool window_buffers(const RingContext& ctx, const CollectiveArgs& args) {
  return window_fit(ctx, args) == WindowFit::kFits;
}

std::string window_passed_over(const RingContext& ctx, const CollectiveArgs& args) {
  const WindowFit fit = window_fit(ctx, args);
  if (fit == WindowFit::kFits || fit == WindowFit::kNoWindows) return "";
  if (!ctx.windows->find(args.send, 1) && !ctx.windows->find(args.recv, 1)) return "";
  const std::string n = std::to_string(ctx.transport.size());
  std::string why;
  switch (fit) {
    case WindowFit::kNotOneHost:
      why = "the " + n + " ranks do not all share this host";
      break;
    case WindowFit::kSmall:
      why = std::to_string(args.count * dtype_size(args.dtype)) +
            " bytes is at most the window path's floor of " +
            std::to_string(window_min_bytes(ctx.transport.size())) + " bytes at " + n +
            " ranks, below which one step of whole vectors is faster";
      break;
    case WindowFit::kOverlap:
      why = "the input and the output overlap without being the same memory";
      break;
    case WindowFit::kManyRanks:
      why = n + " ranks share this host, more than the " + std::to_string(Device::kMaxReduceAll) +
            " whose device buffers one kernel reads, so device buffers are staged";
      break;
    default: {
      const size_t bytes = args.count * dtype_size(args.dtype);
      const auto inside = [&](const void* p) {
        const auto place = ctx.windows->find(p, bytes);
        return place && place->window->device() == args.device;
      };
      const bool send = inside(args.send), recv = inside(args.recv);
      why = std::string(!send && !recv ? "neither the input nor the output is"
                        : !send        ? "the input is not"
                                       : "the output is not") +
            " wholly inside a " +
            (args.device >= 0 ? "window of device " + std::to_string(args.device)
                              : std::string("host window"));
      break;
    }
  }
  return "not the window path: " + why + "; ";
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

// Rank `rank`'s chunk [lo, hi) of the vector, reduced out of every rank's
// input in rank order with reduce_all()'s arithmetic (16-bit floats accumulate
// in float32 and round once: one place reads every input, so no hop need
// round) and written into every rank's output, on the host: a block at a
// time, so that the copies into the peers' outputs read it from the cache.
void reduce_chunk_on_host(const RingContext& ctx, const CollectiveArgs& args,
                          const std::vector<const char*>& in, const std::vector<char*>& out,
                          size_t lo, size_t hi) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const size_t block = std::max<size_t>(1, kBlockBytes / elem);
  const int divisor = args.op == ReduceOp::kAvg ? size : 0;
  std::vector<const void*> inputs(static_cast<size_t>(size));
  for (size_t at = lo; at < hi; at += block) {
    const size_t n = std::min(hi, at + block) - at;
    const size_t off = at * elem;
    for (size_t r = 0; r < inputs.size(); ++r) inputs[r] = in[r] + off;
    // In place, our output is our input: reduce_all reads a block of every
    // input before it writes it.
    char* o = out[static_cast<size_t>(rank)] + off;
    reduce_all(args.dtype, args.op, inputs.data(), inputs.size(), o, n, divisor);
    // Only this rank reads any rank's input in this chunk, and it is done
    // with this block: the outputs may take it even where they are inputs.
    for (int i = 1; i < size; ++i) {
      std::memcpy(out[static_cast<size_t>((rank + i) % size)] + off, o, n * elem);
    }
  }
}

// The same on the device, whose kernel reads the peers' device memory where
// it is mapped: one reduce_all kernel for the whole chunk that reads every
// rank's input and writes every rank's output (the host's bits); returns once
// the device has run it.
void reduce_chunk_on_device(RingContext& ctx, const CollectiveArgs& args,
                            const std::vector<const char*>& in, const std::vector<char*>& out,
                            size_t lo, size_t hi) {
  Device& d = *ctx.device;
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (hi > lo) {
    const size_t off = lo * dtype_size(args.dtype);
    std::vector<const void*> inputs(static_cast<size_t>(size));
    std::vector<void*> outputs(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      inputs[static_cast<size_t>(r)] = in[static_cast<size_t>(r)] + off;
      outputs[static_cast<size_t>(r)] = out[static_cast<size_t>((rank + r) % size)] + off;
    }
    d.reduce_all(Lane::kToDevice, args.dtype, args.op, inputs.data(), size, outputs.data(), size,
                 hi - lo, args.op == ReduceOp::kAvg ? size : 0);
  }
  d.record(Lane::kToDevice, kChunkDone);
  d.sync(kChunkDone, ctx.deadline());
}

}  // namespace

void window_all_reduce(RingContext& ctx, const CollectiveArgs& args) {
  Bulletin& bulletin = *ctx.transport.bulletin();
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t elem = dtype_size(args.dtype);
  const size_t bytes = args.count * elem;
  const uint64_t seq = ctx.seq;
  const bool on_device = args.device >= 0;
  // Our phase in this call: every peer located (nobody touches a rank's
  // buffers before it says so), then done with them all.
  const uint64_t located = 2 * seq - 1;
  const uint64_t done = 2 * seq;
  auto send = ctx.windows->find(args.send, bytes);
  auto recv = ctx.windows->find(args.recv, bytes);
  if (!send || !recv) throw Error("all_reduce: the window path's buffers left their windows");
  // Chunk r of the vector is rank r's: it reduces it and writes it into every
  // rank's output.
  const size_t chunk = (args.count + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
  const size_t lo = std::min(args.count, chunk * static_cast<size_t>(rank));
  const size_t hi = std::min(args.count, lo + chunk);
  if (on_device) {
    // Device memory is ready for the peers once the caller's stream has
    // run all it queued before the call: the host waits for it before it
    // says `located`, and meanwhile publishes and reads the entries.
    Device& d = *ctx.device;
    d.begin(*ctx.device_mark);  // first: it makes the device current here
    d.record(Lane::kToDevice, kCallerReady);
  }
  Entry mine{};
  mine.header = make_call_header(ctx, args, Algorithm::kWindow);
  mine.refs = {send->window->id(), send->offset, recv->window->id(), recv->offset, args.device};
  bulletin.publish(seq, &mine, sizeof mine, true, ctx.deadline());

  // Every rank's input and output, as mapped here.
  std::vector<const char*> in(static_cast<size_t>(size));
  std::vector<char*> out(static_cast<size_t>(size));
  std::vector<std::shared_ptr<Window>> held;  // their windows, alive for the call
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
      if ((theirs.refs.device >= 0) != on_device) {
        auto where = [](int64_t device) {
          return device >= 0 ? "device windows (cuda:" + std::to_string(device) + ")"
                             : std::string("host windows");
        };
        throw MismatchError("all_reduce: rank " + std::to_string(peer) + "'s buffers are in " +
                                where(theirs.refs.device) + ", rank " + std::to_string(rank) +
                                "'s in " + where(args.device) + " in call #" + std::to_string(seq) +
                                " (the window path reads every rank's buffers where they are: "
                                "all ranks' must be host memory, or all device memory)",
                            peer);
      }
      auto locate = [&](uint64_t id, uint64_t offset, const char* what) -> char* {
        std::shared_ptr<Window> w = ctx.windows->get(id);
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
    if (on_device) ctx.device->sync(kCallerReady, ctx.deadline());
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
    if (on_device) {
      reduce_chunk_on_device(ctx, args, in, out, lo, hi);
    } else {
      reduce_chunk_on_host(ctx, args, in, out, lo, hi);
    }
    // Our chunk is in every output and we read no input any more. Once every
    // peer says the same, our output is whole and nobody touches our buffers.
    bulletin.raise_phase(done);
    await_all(ctx, bulletin, done, "to write its chunk into every output");
  } catch (...) {
    if (on_device) {
      // Nothing of ours may still be reading or writing when we say done.
      try {
        ctx.device->finish(Deadline::after(ctx.timeout_seconds));
      } catch (...) {
        // The device did not drain in time: say so all the same, as a host
        // rank that cannot wait longer does.
      }
    }
    settle(ctx, bulletin, done);
    throw;
  }
}

}  // namespace rr
