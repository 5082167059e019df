// The TCP transport's inner parts, shared by its source files (tcp_links.cc:
// listening, connecting and hellos; tcp_transport.cc: queues, progress and
// waiting). Not part of the engine's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/tcp/hello.h"
#include "transport/tcp/tcp_transport.h"

namespace rr {

// A send or a receive in flight: `left` falls as the kernel takes its bytes,
// on whichever streams its pieces went to. A receive into a view owns its
// buffer (`slot`) until released.
struct TcpTransport::Op : Request {
  Op(int peer, char* data, size_t bytes, bool sending)
      : peer_(peer), data(data), left(bytes), total(bytes), sending_(sending) {}
  bool done() const override { return left == 0; }
  int peer() const override { return peer_; }
  const char* view() const override { return slot && done() ? slot->data() : nullptr; }
  bool sending() const override { return sending_; }
  std::string what() const override { return describe_message(sending_, total, peer_); }

  int peer_;
  char* data;
  size_t left;
  size_t total;
  bool sending_;
  ViewPool::Slot slot;
};

// The bytes of an Op that one stream carries; `cursor` advances as they move.
struct TcpTransport::Piece {
  std::shared_ptr<Op> op;
  char* cursor;
  size_t left;
};

// One connection of a link, with its FIFO of pieces.
struct TcpTransport::Stream {
  Fd fd;
  std::deque<Piece> queue;
  // The peer closed a stream we only send on. Harmless unless we send again.
  bool peer_closed = false;
  // Bytes this end moved on it (sent or received): what a reuse compares.
  uint64_t moved = 0;
  bool failed = false;       // an error, an end of stream or a notice: never used again
  bool notice_sent = false;  // we sent our one notice back (receive streams)
  bool notice_read = false;  // we read the peer's "gave up" (send streams)
};

// One direction between us and a peer: one or more streams.
struct TcpTransport::Link {
  Link(int peer, bool sending, int streams)
      : peer(peer), sending(sending), streams(static_cast<size_t>(streams)) {}

  // A receiving link some of whose streams the peer has not connected yet:
  // pieces queue until accept_arrivals() finds their connections.
  bool awaiting() const { return arrived < streams.size(); }

  int peer;
  bool sending;
  std::vector<Stream> streams;
  size_t arrived = 0;     // streams connected so far
  uint64_t messages = 0;  // messages posted so far: which stream(s) the next one takes
  // Bytes moved on this link so far: how wait() tells progress from a stall.
  uint64_t moved = 0;
  // Buffers of released views, reused by the next irecv_view.
  ViewPool views;
};

// A connection accepted on our listener, until its Hello says who it is.
struct TcpTransport::Arrival {
  explicit Arrival(Fd fd) : fd(std::move(fd)) {}
  Fd fd;
  LinkHello hello{};
  size_t got = 0;
};

namespace tcp {

// Connections waiting to say hello, at most: more (a flood of strangers) are
// closed at once.
constexpr size_t kMaxArrivals = 1024;

// Messages from this size are cut across every stream of a link, into pieces
// of whole pages.
constexpr size_t kStripeMinBytes = 64 << 10;
constexpr size_t kStripeAlign = 4096;

// The one byte a receiving end may send back on a stream, which otherwise
// carries data the other way only: it closed its communicator (then the end of
// the stream follows), or it gave up on it and parked the stream. An end of
// stream with neither before it means the process ended.
constexpr char kGoodbye = 'B';
constexpr char kGaveUp = 'R';

inline std::string peer_name(int peer) { return "rank " + std::to_string(peer); }

inline std::string addr_prefix(const std::string& prefix) { return prefix + "addr/"; }
inline std::string addr_key(const std::string& prefix, int rank) {
  return addr_prefix(prefix) + std::to_string(rank);
}

// What a rank publishes under addr_key: how many streams a link into it has, then
// where it listens ("2 10.0.0.7:41234").
inline std::string link_record(int streams, const std::string& host, int port) {
  return std::to_string(streams) + " " + host + ":" + std::to_string(port);
}

struct LinkRecord {
  std::string host;
  int port = 0;
  int streams = 0;
};

inline LinkRecord parse_link_record(const std::string& record) {
  LinkRecord r;
  const size_t space = record.find(' ');
  const size_t colon = record.rfind(':');
  if (space == std::string::npos || colon == std::string::npos || colon < space) return r;
  r.streams = std::atoi(record.substr(0, space).c_str());
  r.host = record.substr(space + 1, colon - space - 1);
  r.port = std::atoi(record.c_str() + colon + 1);
  return r;
}

}  // namespace tcp

// The two source files of the transport use these unqualified.
using tcp::addr_key;
using tcp::addr_prefix;
using tcp::kMaxArrivals;
using tcp::kStripeAlign;
using tcp::kStripeMinBytes;
using tcp::link_record;
using tcp::LinkRecord;
using tcp::parse_link_record;
using tcp::peer_name;

}  // namespace rr
