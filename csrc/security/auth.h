// Proof of a shared job secret without sending it: HMAC-SHA256 (RFC 2104,
// on common/sha256.h), fresh random nonces, and the proofs that store
// connections and data links exchange when a job token is configured
// (RINGREDUCE_TOKEN, or init(token=...)).
//
// With no token every proof is computed with an empty key, which anyone can
// do: the handshakes still run, so a rank with a token and one without
// disagree loudly instead of misreading each other, but nothing is secret.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/sha256.h"

namespace rr {

using Nonce = std::array<uint8_t, 16>;

Digest hmac_sha256(std::string_view key, std::string_view message);

// Equality that takes the same time wherever the first difference is.
bool digests_equal(const Digest& a, const Digest& b);

// Random bytes from the kernel (getrandom). Throws Error if none are available.
Nonce random_nonce();
uint64_t random_u64();

// HMAC(token, label | the bytes of each part, each preceded by its length):
// the label says which side proves what, so a proof cannot be replayed in
// another role.
Digest prove(std::string_view token, std::string_view label,
             std::initializer_list<std::string_view> parts);

inline std::string_view bytes_of(const Nonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

}  // namespace rr
