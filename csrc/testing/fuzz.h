// A fuzzer for every parser of bytes that another process controls: the
// store's requests, replies, notices and handshake, the TCP link hello, the
// call header and the failure reports read back from the store. Each gets
// random frames and mutations of valid ones (flipped bytes, lengths set to
// the edges, truncations, extra bytes), fed in random pieces the way a socket
// delivers them, and each result is checked against the parser's contract.
// Built into the test hooks (ringreduce._core.testing.fuzz_parsers) so that
// the sanitizer build of the engine runs it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace rr {

struct FuzzCounts {
  uint64_t frames = 0;      // inputs tried
  uint64_t accepted = 0;    // parsed as valid
  uint64_t rejected = 0;    // refused as malformed
  uint64_t incomplete = 0;  // waiting for more bytes at the end of the input
  uint64_t violations = 0;  // results that break the parser's contract (must stay 0)
  std::string first_violation;
};

// `frames` inputs per parser from a generator seeded with `seed`.
std::map<std::string, FuzzCounts> fuzz_parsers(uint64_t frames, uint64_t seed);

}  // namespace rr
