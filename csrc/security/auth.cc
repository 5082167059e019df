#include "security/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace rr {
namespace {

void fill_random(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t k = ::getrandom(p, n, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw Error(errno_message("getrandom()", errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace

Digest hmac_sha256(std::string_view key, std::string_view message) {
  uint8_t block[64] = {};
  if (key.size() > 64) {
    const Digest k = sha256(key);
    std::memcpy(block, k.data(), k.size());
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  char ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = static_cast<char>(block[i] ^ 0x36);
    opad[i] = static_cast<char>(block[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.update({ipad, 64});
  inner.update(message);
  const Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update({opad, 64});
  outer.update({reinterpret_cast<const char*>(inner_digest.data()), inner_digest.size()});
  return outer.finish();
}

bool digests_equal(const Digest& a, const Digest& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

Nonce random_nonce() {
  Nonce n;
  fill_random(n.data(), n.size());
  return n;
}

uint64_t random_u64() {
  uint64_t v;
  fill_random(&v, sizeof v);
  return v;
}

Digest prove(std::string_view token, std::string_view label,
             std::initializer_list<std::string_view> parts) {
  std::string message(label);
  for (std::string_view part : parts) {
    const uint32_t n = static_cast<uint32_t>(part.size());
    message.append(reinterpret_cast<const char*>(&n), sizeof n);
    message.append(part);
  }
  return hmac_sha256(token, message);
}

}  // namespace rr
