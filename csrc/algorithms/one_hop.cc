#include "algorithms/one_hop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "algorithms/ring_schedule.h"
#include "common/error.h"

namespace rr {
namespace {

constexpr uint64_t kSeedBase = 0x52494E47;  // "RING": the top word of every seed
constexpr size_t kMaxPieces = 64;
// Codec work done while rows travel is cut into runs of this many values,
// with a poke() of the transport between them, so the link never idles long.
constexpr size_t kPokeValues = 64 * codec::kBlock;

uint64_t splitmix(uint64_t key, uint64_t word) {
  uint64_t z = (key ^ word) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

using Range = std::pair<size_t, size_t>;

// The pieces' step: a multiple of whole blocks (so that a piece's blocks, and
// their scales, are the chunk's), at least piece_values long, and long enough
// for kMaxPieces at most; 0 when the call runs whole.
size_t piece_step(size_t longest, size_t piece_values) {
  if (piece_values == 0 || longest < 2 * piece_values) return 0;
  const size_t count = std::min(kMaxPieces, longest / piece_values);
  return round_up((longest + count - 1) / count, codec::kBlock);
}

// Where each region of the schedule's scratch lies (64-byte aligned).
struct Layout {
  size_t pieces = 1;
  size_t step = 0;  // values per piece of a chunk (0: whole)
  size_t row = 0;   // bytes of one row
  size_t send = 0, recv = 0, acc = 0, wide = 0, target = 0, end = 0;
};

// The bytes of n values in a row: the codec's payload, or float32 when the
// call runs exact (its codec fell back after a canary).
size_t payload_size(const CollectiveArgs& args, size_t n) {
  if (args.compression.exact || args.compression.codec == 0) return n * sizeof(float);
  return codec::payload_bytes(static_cast<codec::CodecKind>(args.compression.codec - 1), n);
}

Layout layout(const CollectiveArgs& args, int size) {
  Layout l;
  const size_t longest = chunk_bounds(args.count, size, 0).second;
  l.step = piece_step(longest, args.compression.piece_values);
  l.pieces = l.step == 0 ? 1 : (longest + l.step - 1) / l.step;
  const size_t piece = l.step == 0 ? longest : l.step;
  l.row = round_up(payload_size(args, piece), 8);
  const size_t rows = l.pieces * static_cast<size_t>(size) * l.row;
  const bool scatter = args.kind == CollectiveKind::kCompressedReduceScatter;
  const bool f32 = args.dtype == DataType::kFloat32;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at = round_up(at + bytes, 64);
    return here;
  };
  l.send = take(rows);
  l.recv = take(rows);
  l.acc = take(scatter ? 0 : longest * sizeof(float));
  l.wide = take(f32 ? 0 : args.count * sizeof(float));
  l.target = take(f32 ? 0 : (scatter ? longest : args.count) * sizeof(float));
  l.end = at;
  return l;
}

// Wall seconds of the codec work, added up.
class CodecClock {
 public:
  explicit CodecClock(double* total) : total_(total) {}
  template <typename F>
  void time(F&& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  double* total_;
};

// The canary (compression/canary.py), once the call's sums are made (before
// avg): this rank's sums at the sample where its own chunk holds them go into
// the second of its rows (the first holds its input there, taken when the
// call began), every rank's rows are gathered, and the error of the sums
// against the exact ones is measured in float64, from the same numbers in the
// same order on every rank, so that every rank reaches the same verdict.
void canary(Executor& x, CodecOps& ops, const Ring& ring, const CollectiveArgs& args,
            const float* acc, const float* target, CompressedReport* report) {
  const Compression& c = args.compression;
  const size_t k = c.sample_count;
  const bool scatter = args.kind == CollectiveKind::kCompressedReduceScatter;
  const auto [lo, hi] = chunk_bounds(args.count, ring.size, ring.rank);
  float* held = c.rows + k;
  for (size_t i = 0; i < k; ++i) {
    const int64_t at = c.sample[i];
    if (at < 0 || static_cast<size_t>(at) < lo || static_cast<size_t>(at) >= hi) continue;
    const size_t from = static_cast<size_t>(at);
    ops.to_host(held + i, scatter ? acc + (from - lo) : target + from, sizeof(float));
  }
  ops.settle();
  const size_t bytes = 2 * k * sizeof(float);
  std::vector<float> gathered(2 * k * static_cast<size_t>(ring.size));
  char* into = reinterpret_cast<char*>(gathered.data());
  std::vector<StepPlan> plans;
  for (int i = 1; i < ring.size; ++i) {
    StepPlan s;
    s.send_to = (ring.rank + i) % ring.size;
    s.send = reinterpret_cast<const char*>(c.rows);
    s.send_bytes = bytes;
    s.recv_from = (ring.rank + ring.size - i) % ring.size;
    s.recv = into + static_cast<size_t>(s.recv_from) * bytes;
    s.recv_bytes = bytes;
    plans.push_back(s);
  }
  x.host_exchange(plans);
  std::copy(c.rows, c.rows + 2 * k,
            gathered.begin() +
                static_cast<std::ptrdiff_t>(ring.rank) * 2 * static_cast<std::ptrdiff_t>(k));
  double err2 = 0, size2 = 0, drift = 0;
  size_t kept = 0;
  for (size_t i = 0; i < k; ++i) {
    double exact = 0, got = 0;
    for (int r = 0; r < ring.size; ++r) {
      const float* rows = gathered.data() + static_cast<size_t>(r) * 2 * k;
      exact += static_cast<double>(rows[i]);
      got += static_cast<double>(rows[k + i]);  // one rank holds each value
    }
    if (!std::isfinite(exact)) continue;
    const double diff = got - exact;
    err2 += diff * diff;
    size2 += exact * exact;
    drift += diff;
    ++kept;
  }
  report->canary_ran = true;
  report->canary_error = report->canary_bias = 0;
  if (kept == 0) return;
  const double err = std::sqrt(err2), size = std::sqrt(size2);
  if (size == 0) {
    if (err != 0) report->canary_error = report->canary_bias = HUGE_VAL;
    return;
  }
  const double rms = size / std::sqrt(static_cast<double>(kept));
  report->canary_error = err / size;
  report->canary_bias = drift / static_cast<double>(kept) / rms;
}

}  // namespace

uint64_t one_hop_key(uint64_t call, HopPhase phase, int rank, int chunk) {
  // hop.py's seed is (RING << 96) | (call << 40) | (phase << 32) | (rank << 16)
  // | chunk, folded into a key by splitmix64 over its words, lowest first.
  const uint64_t low = (call << 40) | (static_cast<uint64_t>(phase) << 32) |
                       (static_cast<uint64_t>(rank) << 16) | static_cast<uint64_t>(chunk);
  const uint64_t high = (kSeedBase << 32) | (call >> 24);
  return splitmix(splitmix(0, low), high);
}

size_t one_hop_pieces(const CollectiveArgs& args, int size) { return layout(args, size).pieces; }

size_t one_hop_scratch_bytes(const CollectiveArgs& args, int size) {
  return layout(args, size).end;
}

void one_hop(Executor& x, const Ring& ring, const CollectiveArgs& args, CompressedReport* report) {
  CodecOps* ops = x.codec_ops();
  if (ops == nullptr) {
    throw InvalidArgument("compressed " +
                          std::string(args.kind == CollectiveKind::kCompressedAllReduce
                                          ? "all_reduce"
                                          : "reduce_scatter") +
                          ": this memory has no codec operations");
  }
  const Compression& c = args.compression;
  const auto kind = static_cast<codec::CodecKind>(c.codec > 0 ? c.codec - 1 : 0);
  const bool scatter = args.kind == CollectiveKind::kCompressedReduceScatter;
  const int size = ring.size;
  const int rank = ring.rank;
  const size_t n = args.count;
  const Layout l = layout(args, size);
  char* base = x.scratch();
  uint8_t* send = reinterpret_cast<uint8_t*>(base + l.send);
  uint8_t* recv = reinterpret_cast<uint8_t*>(base + l.recv);
  auto row = [&](uint8_t* rows, size_t p, int k) {
    return rows + (p * static_cast<size_t>(size) + static_cast<size_t>(k)) * l.row;
  };
  CodecClock clock(&report->codec_seconds);
  // The codec's operations, or their exact stand-ins: float32 rows, copied
  // and added (a residual is sent along, and cleared).
  const bool raw = c.exact || c.codec == 0;
  // `out_only`: the owner's encode of its sum, whose error goes into `owed`
  // without anything owed being added first.
  auto encode = [&](const float* v, float* owed, bool out_only, size_t m, uint64_t key,
                    uint8_t* payload, uint64_t first) {
    if (!raw) {
      ops->encode(kind, v, owed, out_only, m, key, payload, first);
    } else if (owed != nullptr && !out_only) {
      ops->add(reinterpret_cast<float*>(payload), v, owed, m);
      ops->zero(owed, m);
    } else {
      ops->convert(DataType::kFloat32, payload, DataType::kFloat32, v, m);
      if (owed != nullptr) ops->zero(owed, m);
    }
  };
  auto decode = [&](const uint8_t* payload, size_t m, float* out) {
    if (!raw) {
      ops->decode(kind, payload, m, out);
    } else {
      ops->convert(DataType::kFloat32, out, DataType::kFloat32, payload, m);
    }
  };
  auto decode_add = [&](const std::vector<const uint8_t*>& from, size_t m, float* sum) {
    if (!raw) {
      ops->decode_add(kind, from.data(), from.size(), m, sum);
      return;
    }
    for (const uint8_t* p : from) ops->add(sum, sum, reinterpret_cast<const float*>(p), m);
  };

  std::vector<Range> bounds;
  for (int k = 0; k < size; ++k) bounds.push_back(chunk_bounds(n, size, k));
  // Piece p of chunk k.
  auto piece = [&](size_t p, int k) -> Range {
    const auto [lo, hi] = bounds[static_cast<size_t>(k)];
    if (l.step == 0) return {lo, hi};
    return {std::min(hi, lo + p * l.step), std::min(hi, lo + (p + 1) * l.step)};
  };
  const auto [lo, hi] = bounds[static_cast<size_t>(rank)];
  const size_t mine = hi - lo;

  // The input as float32 (itself, or widened), and where the float32 sum is made.
  const bool f32 = args.dtype == DataType::kFloat32;
  const float* in = static_cast<const float*>(args.send);
  if (!f32) {
    float* wide = reinterpret_cast<float*>(base + l.wide);
    clock.time([&] { ops->convert(DataType::kFloat32, wide, args.dtype, args.send, n); });
    in = wide;
  }
  // The canary's first row: this rank's input at the sample, before any of
  // it is overwritten (out=x).
  if (c.sample_count > 0 && !c.exact) {
    for (size_t i = 0; i < c.sample_count; ++i) {
      const int64_t at = c.sample[i];
      if (at >= 0 && static_cast<size_t>(at) < n) {
        ops->to_host(c.rows + i, in + static_cast<size_t>(at), sizeof(float));
      }
    }
  }
  float* target = f32 ? static_cast<float*>(args.recv) : reinterpret_cast<float*>(base + l.target);
  // The owner's sum of its chunk: straight into the result for reduce_scatter.
  float* acc = scatter ? target : reinterpret_cast<float*>(base + l.acc);
  float* residual = c.residual;

  // It starts as the owner's own contribution, never encoded.
  clock.time([&] {
    if (residual != nullptr) {
      ops->add(acc, in + lo, residual + lo, mine);
    } else if (acc != in + lo) {
      ops->convert(DataType::kFloat32, acc, DataType::kFloat32, in + lo, mine);
    }
  });

  // Between the codec operations that run while rows travel, the transport
  // moves what it can (poking): each is one chunk's piece, well under a
  // millisecond, while the kernel's socket buffers hold several.
  auto encode_scatter = [&](size_t p, bool poking) {
    for (int k = 0; k < size; ++k) {
      const auto [a, b] = piece(p, k);
      if (k == rank || b <= a) continue;
      clock.time([&] {
        encode(in + a, residual == nullptr ? nullptr : residual + a, false, b - a,
               one_hop_key(c.call, HopPhase::kWorker, rank, k), row(send, p, k),
               a - bounds[static_cast<size_t>(k)].first);
      });
      if (poking) x.poke();
    }
  };
  // The owner's sum of piece p: + the N-1 payloads (in rank order), then, for
  // all_reduce, encoded once into the row it gathers from (its residual keeps
  // that error, in sum units).
  std::vector<const uint8_t*> payloads;
  auto owner_sum = [&](size_t p) {
    const auto [a, b] = piece(p, rank);
    if (b <= a) return;
    payloads.clear();
    for (int j = 0; j < size; ++j) {
      if (j != rank) payloads.push_back(row(recv, p, j));
    }
    float* sum = acc + (a - lo);
    clock.time([&] {
      decode_add(payloads, b - a, sum);
      if (scatter) return;
      // The owner's error stays with it, in its own chunk's residual (what
      // that held was added into the sum at the start).
      encode(sum, residual == nullptr ? nullptr : residual + a, true, b - a,
             one_hop_key(c.call, HopPhase::kOwner, rank, rank), row(recv, p, rank), a - lo);
    });
  };
  // Every owner's sum of piece p into the result: the rows gathered into
  // send's (spent by the scatter), this rank's own where it encoded it.
  auto decode_all = [&](size_t p, bool poking) {
    for (int k = 0; k < size; ++k) {
      const auto [a, b] = piece(p, k);
      if (b <= a) continue;
      const uint8_t* from = k == rank ? row(recv, p, k) : row(send, p, k);
      clock.time([&] { decode(from, b - a, target + a); });
      if (poking) x.poke();
    }
  };
  // The exchanges: each rank's row k to rank k (scatter), or its own row to
  // every rank (gather), peers in the order of their distance on the ring.
  auto scatter_plans = [&](size_t p, std::vector<StepPlan>& plans) {
    for (int i = 1; i < size; ++i) {
      StepPlan s;
      s.send_to = (rank + i) % size;
      s.send = reinterpret_cast<const char*>(row(send, p, s.send_to));
      s.send_bytes = l.row;
      s.recv_from = (rank + size - i) % size;
      s.recv = reinterpret_cast<char*>(row(recv, p, s.recv_from));
      s.recv_bytes = l.row;
      plans.push_back(s);
    }
  };
  auto gather_plans = [&](size_t p, std::vector<StepPlan>& plans) {
    for (int i = 1; i < size; ++i) {
      StepPlan s;
      s.send_to = (rank + i) % size;
      s.send = reinterpret_cast<const char*>(row(recv, p, rank));
      s.send_bytes = l.row;
      s.recv_from = (rank + size - i) % size;
      s.recv = reinterpret_cast<char*>(row(send, p, s.recv_from));
      s.recv_bytes = l.row;
      plans.push_back(s);
    }
  };

  // While piece p-1's gather and piece p+1's scatter travel, the owner sums
  // piece p, piece p+2 is encoded and piece p-2 decoded: the link has work
  // whenever there is any to send. Every rank posts each link's messages in
  // the same order (gathers, then scatters).
  const size_t pieces = l.pieces;
  const bool overlap = pieces > 1;
  std::vector<StepPlan> plans;
  encode_scatter(0, false);
  scatter_plans(0, plans);
  x.exchange_while(plans, [&] {
    if (pieces > 1) encode_scatter(1, true);
  });
  for (size_t p = 0; p < pieces; ++p) {
    plans.clear();
    if (!scatter && p >= 1) gather_plans(p - 1, plans);
    if (p + 1 < pieces) scatter_plans(p + 1, plans);
    x.exchange_while(plans, [&] {
      owner_sum(p);
      if (overlap) x.poke();
      if (p + 2 < pieces) encode_scatter(p + 2, true);
      if (!scatter && p >= 2) decode_all(p - 2, overlap);
    });
  }
  if (!scatter) {
    plans.clear();
    gather_plans(pieces - 1, plans);
    x.exchange_while(plans, [&] {
      if (pieces >= 2) decode_all(pieces - 2, true);
    });
    decode_all(pieces - 1, false);
  }
  if (scatter && residual != nullptr) {
    clock.time([&] { ops->zero(residual + lo, mine); });  // sent whole: nothing owed
  }

  if (c.sample_count > 0 && !raw) canary(x, *ops, ring, args, acc, target, report);
  const size_t out_count = scatter ? mine : n;
  clock.time([&] {
    if (args.op == ReduceOp::kAvg) ops->divide(target, out_count, size);
    if (!f32) ops->convert(args.dtype, args.recv, DataType::kFloat32, target, out_count);
  });
}

}  // namespace rr
