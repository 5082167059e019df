#include "testing/fuzz.h"

#include <cstring>
#include <random>
#include <string_view>

#include "algorithms/call_header.h"
#include "common/error.h"
#include "engine/failure_report.h"
#include "rendezvous/store_protocol.h"
#include "transport/tcp/hello.h"

namespace rr {
namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool chance(int percent) { return below(100) < static_cast<uint64_t>(percent); }
  std::string bytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(below(256));
    return s;
  }
  // A length near an edge that an attacker would pick.
  uint32_t edgy_length(uint32_t limit) {
    static const uint32_t edges[] = {0,          1,          0x7FFFFFFF, 0x80000000,
                                     0xFFFFFFF0, 0xFFFFFFF8, 0xFFFFFFFF};
    switch (below(4)) {
      case 0:
        return edges[below(sizeof edges / sizeof edges[0])];
      case 1:
        return limit + static_cast<uint32_t>(below(3));
      case 2:
        return limit - static_cast<uint32_t>(below(3));
      default:
        return static_cast<uint32_t>(rng_());
    }
  }
  // `s` cut or padded with random bytes to `n`: a frame read as exactly n bytes.
  std::string fit(std::string s, size_t n) {
    if (s.size() > n) s.resize(n);
    if (s.size() < n) s += bytes(n - s.size());
    return s;
  }
  // Flips, overwrites, truncates or extends `s`.
  std::string mutate(std::string s) {
    const int rounds = 1 + static_cast<int>(below(4));
    for (int i = 0; i < rounds; ++i) {
      switch (below(5)) {
        case 0:
          if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 + below(255));
          break;
        case 1:
          if (!s.empty()) s[below(s.size())] = static_cast<char>(below(256));
          break;
        case 2:
          s.resize(below(s.size() + 1));
          break;
        case 3:
          s += bytes(below(16));
          break;
        default:
          if (s.size() >= 4) {
            const uint32_t v = edgy_length(kStoreMaxKey);
            std::memcpy(&s[below(s.size() - 3)], &v, 4);
          }
      }
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

void violation(FuzzCounts& c, const std::string& what) {
  if (c.violations++ == 0) c.first_violation = what;
}

std::string random_store_request(Gen& g) {
  const uint8_t cmd = static_cast<uint8_t>(1 + g.below(4));
  if (cmd == kStoreWait && g.chance(70)) {  // mostly well-formed waits: 0 to 1000 ms
    return encode_store_request(cmd, g.bytes(g.below(40)), std::to_string(g.below(1001)));
  }
  return encode_store_request(cmd, g.bytes(g.below(40)), g.bytes(g.below(100)));
}

// Feeds `input` in random pieces into an inbox and parses whatever is
// complete, as a server or a client does.
template <typename ParseOne>
void feed(Gen& g, const std::string& input, FuzzCounts& c, ParseOne parse_one) {
  std::string inbox;
  size_t at = 0;
  bool closed = false;
  while (at < input.size() && !closed) {
    const size_t piece = 1 + g.below(input.size() - at);
    inbox.append(input, at, piece);
    at += piece;
    while (true) {
      size_t consumed = 0;
      const Parse r = parse_one(inbox, &consumed);
      if (r == Parse::kNeedMore) break;
      if (r == Parse::kMalformed) {
        ++c.rejected;
        closed = true;  // the connection would be closed here
        break;
      }
      if (consumed == 0 || consumed > inbox.size()) {
        violation(c, "consumed " + std::to_string(consumed) + " of " +
                         std::to_string(inbox.size()) + " bytes");
        closed = true;
        break;
      }
      ++c.accepted;
      inbox.erase(0, consumed);
    }
  }
  if (!closed && !inbox.empty()) ++c.incomplete;
}

void fuzz_store_requests(Gen& g, FuzzCounts& c) {
  std::string input;
  if (g.chance(30)) {
    input = g.bytes(g.below(64));
  } else {
    for (int i = 0, n = 1 + static_cast<int>(g.below(3)); i < n; ++i)
      input += random_store_request(g);
    if (g.chance(80)) input = g.mutate(input);
  }
  ++c.frames;
  feed(g, input, c, [&](const std::string& inbox, size_t* consumed) {
    StoreRequest req;
    std::string error;
    const Parse r = parse_store_request(inbox, &req, consumed, &error);
    if (r == Parse::kDone && (req.key.size() > kStoreMaxKey || req.value.size() > kStoreMaxValue ||
                              req.command < kStoreSet || req.command > kStoreWait ||
                              *consumed != 9 + req.key.size() + req.value.size())) {
      violation(c, "accepted a request outside the limits");
    }
    if (r == Parse::kDone && req.command == kStoreWait) {
      // Checked here without the parser's code: 1 to 4 digits, their number the wait.
      bool digits = !req.value.empty() && req.value.size() <= 4;
      long ms = 0;
      for (size_t i = 0; digits && i < req.value.size(); ++i) {
        const char ch = req.value[i];
        digits = ch >= '0' && ch <= '9';
        ms = ms * 10 + (ch - '0');
      }
      if (!digits || ms != req.wait_ms || ms > kStoreMaxWaitMs) {
        violation(c, "accepted a wait that is not 0 to 1000 decimal milliseconds");
      }
    }
    if (r == Parse::kMalformed && error.empty()) violation(c, "rejected without a reason");
    return r;
  });
}

void fuzz_store_replies(Gen& g, FuzzCounts& c) {
  std::string input;
  if (g.chance(30)) {
    input = g.bytes(g.below(64));
  } else {
    std::string body = g.chance(50) ? g.bytes(g.below(60)) : g.bytes(8) + '\0' + g.bytes(20);
    input = encode_store_reply(static_cast<uint8_t>(g.below(3)), body);
    if (g.chance(80)) input = g.mutate(input);
  }
  ++c.frames;
  feed(g, input, c, [&](const std::string& inbox, size_t* consumed) {
    uint8_t status = 0;
    std::string body, error;
    const Parse r = parse_store_reply(inbox, &status, &body, consumed, &error);
    if (r == Parse::kDone) {
      if (status > kStoreNotice || body.size() > kStoreMaxBody || *consumed != 5 + body.size()) {
        violation(c, "accepted a reply outside the limits");
      }
      std::string key, value;
      if (status == kStoreNotice && split_notice(body, &key, &value) &&
          (key.size() > kStoreMaxKey || key.size() + 1 + value.size() != body.size())) {
        violation(c, "split a notice wrongly");
      }
    }
    return r;
  });
}

void fuzz_greetings(Gen& g, FuzzCounts& c) {
  StoreGreeting valid{g.chance(50), {}};
  std::string input = encode_greeting(valid);
  const bool mutated = g.chance(85);
  // The client reads exactly this many bytes (or times out).
  if (mutated) input = g.fit(g.mutate(input), kStoreGreetingBytes);
  ++c.frames;
  StoreGreeting out;
  std::string error;
  if (parse_greeting(input, &out, &error)) {
    ++c.accepted;
    if (std::memcmp(input.data(), kStoreGreetingMagic, 4) != 0 ||
        static_cast<uint8_t>(input[4]) > 1) {
      violation(c, "accepted a greeting with a bad magic or flags");
    }
  } else {
    ++c.rejected;
    if (error.empty()) violation(c, "rejected without a reason");
  }
}

void fuzz_link_hellos(Gen& g, FuzzCounts& c) {
  const int size = 2 + static_cast<int>(g.below(16));
  const int self = static_cast<int>(g.below(static_cast<uint64_t>(size)));
  const uint64_t session = g.below(UINT64_MAX);
  const std::string token = g.chance(20) ? "" : g.bytes(1 + g.below(40));
  int from = static_cast<int>(g.below(static_cast<uint64_t>(size)));
  if (from == self) from = (from + 1) % size;
  const int streams = 1 + static_cast<int>(g.below(kMaxLinkStreams));
  const int stream = static_cast<int>(g.below(static_cast<uint64_t>(streams)));
  LinkHello valid = make_link_hello(from, self, session, token, stream, streams);
  std::string wire(reinterpret_cast<const char*>(&valid), sizeof valid);
  const bool random = g.chance(20);
  // The acceptor reads exactly this many bytes.
  std::string input =
      random ? g.bytes(sizeof(LinkHello)) : g.fit(g.mutate(wire), sizeof(LinkHello));
  ++c.frames;
  LinkHello h;
  std::memcpy(&h, input.data(), sizeof h);
  const std::string why = check_link_hello(h, self, size, session, token);
  if (why.empty()) {
    ++c.accepted;
    // Only the untouched hello may pass: anything else would be a forgery.
    if (input != wire) violation(c, "accepted a hello that was not the one made for this link");
  } else {
    ++c.rejected;
    if (input == wire) violation(c, "refused a valid hello: " + why);
  }
}

void fuzz_call_headers(Gen& g, FuzzCounts& c) {
  CallHeader mine{};
  mine.magic = kCallHeaderMagic;
  mine.kind = static_cast<uint8_t>(1 + g.below(9));
  mine.dtype = static_cast<uint8_t>(g.below(8));
  mine.op = static_cast<uint8_t>(g.below(5));
  mine.seq = g.below(1000);
  mine.count = g.below(1 << 20);
  mine.root = static_cast<int32_t>(g.below(8));
  mine.segment_bytes = 128 << 10;
  mine.issuer = g.below(3);
  std::string wire(reinterpret_cast<const char*>(&mine), sizeof mine);
  std::string input = g.chance(20) ? g.bytes(sizeof mine) : g.fit(g.mutate(wire), sizeof mine);
  ++c.frames;
  CallHeader theirs;
  std::memcpy(&theirs, input.data(), sizeof theirs);
  const bool same = theirs.magic == mine.magic && theirs.kind == mine.kind &&
                    theirs.dtype == mine.dtype && theirs.op == mine.op &&
                    theirs.algorithm == mine.algorithm && theirs.seq == mine.seq &&
                    theirs.count == mine.count && theirs.root == mine.root &&
                    theirs.segment_bytes == mine.segment_bytes && theirs.issuer == mine.issuer;
  try {
    check_call_header(theirs, mine, 1, 2);
    ++c.accepted;
    if (!same) violation(c, "accepted a header that differs from ours");
  } catch (const MismatchError& e) {
    ++c.rejected;
    if (same) violation(c, std::string("refused an equal header: ") + e.what());
  }
}

void fuzz_failure_records(Gen& g, FuzzCounts& c) {
  const int size = 1 + static_cast<int>(g.below(64));
  FailureRecord valid{g.chance(50) ? "peer" : "timeout",
                      static_cast<int>(g.below(static_cast<uint64_t>(size))),
                      static_cast<int>(g.below(static_cast<uint64_t>(size))), g.bytes(g.below(80))};
  if (g.chance(50)) valid.reason = kUnreachable;
  const FailureRecord same = FailureRecord::decode(valid.encode(), size);
  if (same.kind != valid.kind || same.peer != valid.peer || same.rank != valid.rank ||
      same.reason != (valid.kind == "peer" ? valid.reason : "")) {
    violation(c, "a valid record did not read back as written");
  }
  std::string input = g.chance(25) ? g.bytes(g.below(120)) : g.mutate(valid.encode());
  if (g.chance(10)) input = "peer\n99999999999999999999\n-7\n" + input;
  ++c.frames;
  const FailureRecord r = FailureRecord::decode(input, size);
  ++c.accepted;
  if (r.peer < -1 || r.peer >= size || r.rank < -1 || r.rank >= size) {
    violation(c, "decoded a rank outside the world");
  }
  if (r.kind != "mismatch" && r.kind != "timeout" && r.kind != "peer" && r.kind != "error") {
    violation(c, "decoded an unknown kind");
  }
  if (r.message.size() > FailureRecord::kMaxMessage + 64) violation(c, "kept an overlong message");
  if (!r.reason.empty() && (r.reason != kUnreachable || r.kind != "peer")) {
    violation(c, "decoded an unknown reason, or a reason on a failure not a peer's");
  }
}

}  // namespace

std::map<std::string, FuzzCounts> fuzz_parsers(uint64_t frames, uint64_t seed) {
  Gen g(seed);
  std::map<std::string, FuzzCounts> out;
  for (uint64_t i = 0; i < frames; ++i) {
    fuzz_store_requests(g, out["store_request"]);
    fuzz_store_replies(g, out["store_reply"]);
    fuzz_greetings(g, out["store_greeting"]);
    fuzz_link_hellos(g, out["link_hello"]);
    fuzz_call_headers(g, out["call_header"]);
    fuzz_failure_records(g, out["failure_report"]);
  }
  return out;
}

}  // namespace rr
