// A shrink's TCP ring taking over the links its revoked communicator parked
// (tcp_transport.h). Both ends of a link publish what their parked streams
// carried; from the two records alone each end decides the same way whether
// the link is taken over, then puts the stream back at a message boundary:
// the receiver reads and drops the bytes the sender's kernel took that it
// never read, and the sender reads the receiver's "gave up" if it has not.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <optional>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "transport/tcp/tcp_internal.h"
#include "transport/tcp/tcp_transport.h"

namespace rr {

namespace {

// More than this many bytes in flight on one stream would not fit the kernel's
// buffers of both ends: such a record is not believed, and the link is remade.
constexpr uint64_t kMaxInFlight = 1ull << 30;

// One parked link, as its record says: which way, to whom, and the bytes each
// of its streams carried.
struct ParkedLink {
  char way = 0;  // 's': this end sent on it, 'r': received
  int peer = -1;
  std::vector<uint64_t> bytes;
  std::vector<bool> notice;  // per stream: "gave up" sent (receiver) or read (sender)
};

std::optional<ParkedLink> find_parked(const std::string& record, char way, int peer) {
  std::istringstream links(record);
  std::string entry;
  while (std::getline(links, entry, ';')) {
    std::istringstream in(entry);
    ParkedLink link;
    if (!(in >> link.way >> link.peer) || link.way != way || link.peer != peer) continue;
    uint64_t b = 0;
    char slash = 0;
    int notice = 0;
    while (in >> b >> slash >> notice && slash == '/') {
      link.bytes.push_back(b);
      link.notice.push_back(notice == 1);
    }
    if (!link.bytes.empty() && in.eof()) return link;
  }
  return std::nullopt;
}

// `what`: the step of taking over the link with `peer` that waits.
void wait_for_socket(int fd, short events, const Deadline& deadline, int peer,
                     const std::string& what) {
  if (deadline.expired()) {
    throw TimeoutError("taking over the link with rank " + std::to_string(peer) +
                           " at the shrink: " + what + " did not finish within " +
                           format_seconds(deadline.seconds()) + " s",
                       peer);
  }
  pollfd p{fd, events, 0};
  ::poll(&p, 1, deadline.poll_ms(100));
}

[[noreturn]] void link_failed(int peer, const std::string& what, int err) {
  const std::string where =
      "taking over the link with rank " + std::to_string(peer) + " at the shrink (" + what + ")";
  throw PeerError(err == 0 ? "rank " + std::to_string(peer) + " closed its end while " + where
                           : errno_message(where, err),
                  peer);
}

// Reads and drops `bytes` bytes.
void drain(int fd, uint64_t bytes, const Deadline& deadline, int peer) {
  const std::string what = "dropping what the revoked communicator left in flight";
  std::vector<char> sink(std::min<uint64_t>(bytes, 1 << 16));
  while (bytes > 0) {
    const ssize_t k = ::recv(fd, sink.data(), std::min<uint64_t>(bytes, sink.size()), MSG_DONTWAIT);
    if (k > 0) {
      bytes -= static_cast<uint64_t>(k);
    } else if (k == 0) {
      link_failed(peer, what, 0);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_for_socket(fd, POLLIN, deadline, peer, what);
    } else {
      link_failed(peer, what, errno);
    }
  }
}

// Reads the "gave up" the receiving end sent back when it parked the stream.
void take_notice(int fd, const Deadline& deadline, int peer) {
  const std::string what = "reading the notice it parked the link with";
  while (true) {
    char notice = 0;
    const ssize_t k = ::recv(fd, &notice, 1, MSG_DONTWAIT);
    if (k == 1 && notice == tcp::kGaveUp) return;
    if (k == 1) {
      throw PeerError("rank " + std::to_string(peer) + " sent byte " +
                          std::to_string(static_cast<unsigned char>(notice)) +
                          " back on a parked link, where only its \"gave up\" notice can come",
                      peer);
    }
    if (k == 0) link_failed(peer, what, 0);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) link_failed(peer, what, errno);
    wait_for_socket(fd, POLLIN, deadline, peer, what);
  }
}

}  // namespace

std::string TcpTransport::parked_record() const {
  std::string record = "v1;";
  if (!parked_) return record;
  for (const auto& link : links_) {
    std::string bytes;
    bool whole = !link->streams.empty();
    for (const Stream& stream : link->streams) {
      whole = whole && stream.fd.valid();
      const bool notice = link->sending ? stream.notice_read : stream.notice_sent;
      bytes += " " + std::to_string(stream.moved) + (notice ? "/1" : "/0");
    }
    if (whole) {
      record += std::string(1, link->sending ? 's' : 'r') + " " + std::to_string(link->peer) +
                bytes + ";";
    }
  }
  return record;
}

bool TcpTransport::reuse_link(const TcpReuse& reuse, int peer, bool sending,
                              const std::string& mine, const std::string& theirs,
                              const Deadline& deadline) {
  const int me_before = reuse.old_ranks[static_cast<size_t>(rank_)];
  const int peer_before = reuse.old_ranks[static_cast<size_t>(peer)];
  const auto here = find_parked(mine, sending ? 's' : 'r', peer_before);
  const auto there = find_parked(theirs, sending ? 'r' : 's', me_before);
  if (!here || !there || here->bytes.size() != there->bytes.size()) return false;
  const std::vector<uint64_t>& sent = sending ? here->bytes : there->bytes;
  const std::vector<uint64_t>& received = sending ? there->bytes : here->bytes;
  const std::vector<bool>& told = sending ? there->notice : here->notice;
  for (size_t i = 0; i < sent.size(); ++i) {
    if (!told[i] || sent[i] < received[i] || sent[i] - received[i] > kMaxInFlight) return false;
  }
  Link* old = reuse.parent->find_link(peer_before, sending);
  if (old == nullptr || old->streams.size() != sent.size()) {
    throw Error("tcp transport: rank " + std::to_string(rank_) + " published a parked link " +
                (sending ? "to" : "from") + " rank " + std::to_string(peer_before) +
                " that it no longer holds");
  }
  auto link = std::make_unique<Link>(peer, sending, static_cast<int>(sent.size()));
  for (size_t i = 0; i < sent.size(); ++i) {
    Fd fd = std::move(old->streams[i].fd);
    if (!sending) drain(fd.get(), sent[i] - received[i], deadline, peer);
    if (sending && !here->notice[i]) take_notice(fd.get(), deadline, peer);
    link->streams[i].fd = std::move(fd);
  }
  link->arrived = link->streams.size();
  links_.push_back(std::move(link));
  ++links_reused_;
  return true;
}

}  // namespace rr
