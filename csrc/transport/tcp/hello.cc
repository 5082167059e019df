#include "transport/tcp/hello.h"

#include <string_view>

namespace rr {
namespace {

template <typename T>
std::string_view raw(const T& v) {
  return {reinterpret_cast<const char*>(&v), sizeof v};
}

Digest link_proof(const std::string& token, uint64_t session, int32_t from, int32_t to,
                  uint16_t stream, uint16_t streams, const Nonce& nonce) {
  return prove(token, "rr-link",
               {raw(session), raw(from), raw(to), raw(stream), raw(streams), bytes_of(nonce)});
}

}  // namespace

LinkHello make_link_hello(int rank, int to, uint64_t session, const std::string& token, int stream,
                          int streams) {
  LinkHello h{};
  h.magic = kLinkHelloMagic;
  h.rank = rank;
  h.session = session;
  h.stream = static_cast<uint16_t>(stream);
  h.streams = static_cast<uint16_t>(streams);
  h.nonce = random_nonce();
  h.proof = link_proof(token, session, rank, to, h.stream, h.streams, h.nonce);
  return h;
}

std::string check_link_hello(const LinkHello& h, int self, int size, uint64_t session,
                             const std::string& token) {
  if (h.magic != kLinkHelloMagic) return "not a ringreduce link (or one of another version)";
  if (h.session != session) return "a connection from another job (session differs)";
  if (h.rank < 0 || h.rank >= size || h.rank == self) {
    return "a hello from rank " + std::to_string(h.rank) + ", not a peer in a world of " +
           std::to_string(size);
  }
  if (h.streams < 1 || h.streams > kMaxLinkStreams || h.stream >= h.streams || h.reserved != 0) {
    return "rank " + std::to_string(h.rank) + "'s hello names stream " + std::to_string(h.stream) +
           " of " + std::to_string(h.streams) + " (at most " + std::to_string(kMaxLinkStreams) +
           ")";
  }
  if (!digests_equal(h.proof,
                     link_proof(token, session, h.rank, self, h.stream, h.streams, h.nonce))) {
    return "rank " + std::to_string(h.rank) + "'s hello did not prove the job's token";
  }
  return "";
}

}  // namespace rr
