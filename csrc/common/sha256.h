// SHA-256 (FIPS 180-4): a hash, nothing secret. The job token's proofs
// (security/auth.h) are built on it, and so is the machine identity
// (common/process_state.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rr {

using Digest = std::array<uint8_t, 32>;

// An incremental hash: update() with the message in any pieces, then finish().
class Sha256 {
 public:
  void update(std::string_view data);
  Digest finish();

 private:
  void compress();

  uint32_t state_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64] = {};
  size_t fill_ = 0;
  uint64_t length_ = 0;
};

Digest sha256(std::string_view data);

}  // namespace rr
