// The first bytes on every TCP data link: who is connecting, for which job,
// and a proof that it holds the job's token, bound to this link (job session,
// both ranks, a fresh nonce) so that it cannot be replayed on another one.
// The acceptor reads nothing else from a connection until its hello checks out.
#pragma once

#include <cstdint>
#include <string>

#include "security/auth.h"

namespace rr {

struct LinkHello {
  uint32_t magic;
  int32_t rank;
  uint64_t session;
  // A link may be several connections (streams) that messages are striped
  // across: which one this is, and how many the link has.
  uint16_t stream;
  uint16_t streams;
  uint32_t reserved;  // 0
  Nonce nonce;
  Digest proof;
};
static_assert(sizeof(LinkHello) == 72, "the hello is part of the wire format");

constexpr uint32_t kLinkHelloMagic = 0x52524833;  // "RRH3"
constexpr int kMaxLinkStreams = 16;

// Our hello to rank `to` of the job `session`, on stream `stream` of `streams`.
LinkHello make_link_hello(int rank, int to, uint64_t session, const std::string& token,
                          int stream = 0, int streams = 1);

// Empty when `h` is a hello to `self` (of `size` ranks) in job `session`,
// proved with `token`, for a stream in range; otherwise why not.
std::string check_link_hello(const LinkHello& h, int self, int size, uint64_t session,
                             const std::string& token);

}  // namespace rr
