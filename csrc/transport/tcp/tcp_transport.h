// The TCP transport: one stream socket to the right ring neighbour (we only
// send on it) and one from the left neighbour (we only receive on it),
// connected up front; sockets to and from any other rank are connected the
// first time a message goes there (all_to_all, gather, point-to-point).
//
// A socket is a byte stream, and messages are simply consecutive bytes on it:
// both ends agree on every message's size (transport.h), so no framing is
// sent. Views (irecv_view) are buffers of ours, reused once released.
//
// A link may be several sockets (streams; RINGREDUCE_TCP_STREAMS, or picked
// from the NIC's speed), for NICs that one TCP stream cannot fill. The
// receiving rank decides how many (it publishes the number with its address).
// Both ends cut the k-th message of a link the same way, from its size alone:
// below kStripeMinBytes it goes whole on stream k mod S; from there it is cut
// into S pieces (4 KiB-aligned), one per stream, starting at stream k mod S.
// Each stream keeps its pieces in order, so no framing is needed here either.
//
// Nothing travels against the data on a stream but one notice byte, from the
// receiving end: a goodbye when it closes its communicator, or "gave up" when
// it aborts (after a failure). The sending end watches for it while it waits:
// "gave up", or the end of the stream without a goodbye (the process ended),
// fails its wait at once, naming that rank. A failure thus travels the ring
// against its direction, each rank telling its left neighbour, and reaches
// every rank: none waits for its deadline.
//
// At abort() the ring links are *parked*, not closed (other links are): the
// receiving end sends its "gave up" and nothing more moves. Where the news
// might not come round (a silent rank, see park()), the link to the right is
// reset instead, which tells that rank, and it passes the reset on. A shrink's new
// transport takes over the parked links between two live ranks that are ring
// neighbours again (TcpReuse): the two ends compare the bytes each stream
// carried, the receiver reads and drops what is still in flight, the sender
// reads the notice if it has not yet, and the stream is clean for the new
// communicator's first message. Only links that touched a dead rank are
// connected anew. close() ends parked links.
//
// Sockets are non-blocking with TCP_NODELAY and large kernel buffers. Progress
// is driven by wait(): it writes and reads as much as the kernel takes on every
// link that has work queued, then poll()s in slices of at most 100 ms until the
// awaited request completes or the deadline passes.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/socket.h"
#include "rendezvous/store.h"
#include "transport/tcp/hello.h"
#include "transport/transport.h"
#include "transport/view_pool.h"

namespace rr {

class TcpTransport;

// What a shrink's new ring may take over: the revoked communicator's TCP
// transport (its links parked; null: none here) and, for each new rank, its
// rank there.
struct TcpReuse {
  TcpTransport* parent = nullptr;
  std::vector<int> old_ranks;
};

class TcpTransport : public Transport {
 public:
  // Every connection opens with a hello proving `token` (hello.h); one that
  // does not is closed unread.
  // Publishes this rank's listening address in `store` under `prefix`, then
  // connects to the right neighbour and accepts the left one, retrying until
  // the deadline. `advertise_host` is the address other ranks can reach us at.
  // `spin` is how long wait() retries before it blocks in poll().
  // `keepalive_seconds`: a link whose peer's machine answers nothing for about
  // that long fails, naming the peer (set_keepalive in common/socket.h; 0: off).
  // `reuse`: take over the ring links that `reuse->parent` parked where both
  // ends are still ring neighbours (every rank passes one, or none does).
  static std::unique_ptr<TcpTransport> connect_ring(
      Store& store, const std::string& prefix, int rank, int size,
      const std::string& advertise_host, std::chrono::microseconds spin, const Deadline& deadline,
      const std::string& token = "", int streams = 1, int keepalive_seconds = 0,
      const TcpReuse* reuse = nullptr);
  // The same without the ring: every link is connected on first use, to the
  // addresses every peer published, all read before this returns.
  static std::unique_ptr<TcpTransport> connect_lazy(
      Store& store, const std::string& prefix, int rank, int size,
      const std::string& advertise_host, std::chrono::microseconds spin, const Deadline& deadline,
      const std::string& token = "", int keepalive_seconds = 0);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  RequestPtr irecv_view(int peer, size_t bytes) override;
  void release(Request& view) override;
  void wait(Request& request, const Deadline& deadline) override;
  bool progress() override;
  bool wait_for(Request& request, std::chrono::microseconds slice) override;
  void wake() override;
  bool reaches(int peer) const override;
  bool connects(int peer) const override;
  void set_eager(bool eager) override { eager_ = eager; }
  // Parks every link (above). Also leaves a notice in the store, so that a
  // peer waiting for a link we never connected (links are made on first use)
  // learns we gave up.
  void abort() noexcept override;
  void close() noexcept override { tear_down(); }
  void note_silent() noexcept override {
    if (cause_ == Cause::kNone) cause_ = Cause::kSilent;
  }
  // With the ring links this transport took over from a parked one, and
  // connected anew.
  TransportStats stats() const override {
    TransportStats s = stats_;
    s.tcp_links_reused = links_reused_;
    s.tcp_links_connected = ring_right_ >= 0 ? 2 - links_reused_ : 0;
    return s;
  }
  // Bytes moved on the link to (sending) or from `peer`.
  uint64_t moved(int peer, bool sending) const override;

 private:
  struct Op;
  struct Waiting;  // one wait() as the waiter sees it (transport/waiter.h)
  struct Piece;
  struct Stream;
  struct Link;
  struct Arrival;

  TcpTransport(int rank, int size, std::chrono::microseconds spin);
  // Publishes our listening address and the number of streams links into us
  // have, and learns the session; the first half of connect_ring and connect_lazy.
  static std::unique_ptr<TcpTransport> listen(Store& store, const std::string& prefix, int rank,
                                              int size, const std::string& advertise_host,
                                              std::chrono::microseconds spin,
                                              const Deadline& deadline, const std::string& token,
                                              int streams, int keepalive_seconds);
  // Connects every stream of our link to `peer` (as many as it asks for).
  Link& connect_to(int peer, const Deadline& deadline);
  // Files an accepted connection whose hello checked out under its link.
  void adopt(Fd fd, const LinkHello& hello);
  // Queues op's bytes on the streams of `link`, cut as the header says.
  void distribute(Link& link, const std::shared_ptr<Op>& op);
  // Whether an accepted connection's hello is a peer's of this job (else it
  // is dropped, with a line on stderr unless it is a stale one).
  bool accept_hello(const LinkHello& hello);
  Link* find_link(int peer, bool sending);
  Link& link_to(int peer, bool sending);  // the link, connecting it first if need be
  // Takes in the connections other ranks made to us, without blocking.
  void accept_arrivals();
  RequestPtr post(std::shared_ptr<Op> op);
  void progress(Link& link);
  void poll_links(const Deadline& deadline);
  // A send stream whose peer said goodbye was reset or hung up: a reset means
  // the peer closed with our data unread (a PeerError).
  void refused_after_goodbye(const Link& link, Stream& stream);
  [[noreturn]] void fail_timeout(const Request& request, const Deadline& deadline);
  void tear_down() noexcept;
  // abort()'s parking of the ring links (above); other links are closed.
  void park() noexcept;
  // What this transport saw fail first, which says whether park() may keep the
  // link to the right. kKnown: news that travels by itself, a peer's notice or
  // the end or failure of a link whose other end died or gave up (which makes
  // that rank, or its ring neighbours, tell the others). kSilent: a rank that
  // may pass nothing on, stopped or cut off: a timeout (fail_timeout,
  // note_silent), an unreachable machine, or a reset from the left neighbour,
  // which is how a rank passes such news on to the right. kNone: nothing here
  // (the failure was elsewhere, or ours alone).
  enum class Cause { kNone, kKnown, kSilent };
  // Records the first cause: a link failed with `err` (0: the end of the
  // stream, or the peer's "gave up").
  void note(const Link& link, int err);
  // Sends our one notice back on a receive stream; false if it could not.
  bool send_notice(Stream& stream, char notice) noexcept;
  // A send stream became readable: the peer's notice, or the end of the
  // stream. Throws PeerError unless it was a goodbye.
  void read_notice(const Link& link, Stream& stream);
  // The parked links, as "<s|r> <peer> <bytes>/<notice> ...;" per link (the
  // bytes each stream carried; the notice: sent, on a receive stream, or
  // read, on a send stream): what both ends compare before a reuse.
  std::string parked_record() const;
  // Takes over (from `reuse.parent`) the link to or from `peer` when both
  // ends' records allow it, draining what the old communicator left in flight.
  bool reuse_link(const TcpReuse& reuse, int peer, bool sending, const std::string& mine,
                  const std::string& theirs, const Deadline& deadline);
  // Throws PeerError when the peer of `request`, whose link is not connected
  // yet, left the notice abort() leaves (asked every kGoneCheck at most).
  void check_gone(const Request& request);

  int rank_;
  int size_;
  std::vector<std::unique_ptr<Link>> links_;
  // For links connected on first use: where the other ranks' addresses are
  // (the communicator's store, which outlives us), our listening socket, the
  // connections accepted but not yet introduced, and how long a connect may take.
  Store* store_ = nullptr;
  std::string prefix_;
  std::vector<std::string> records_;  // each peer's link_record, when read in advance
  uint64_t session_ = 0;
  std::string token_;
  int streams_ = 1;  // streams of every link into this rank
  int keepalive_seconds_ = 0;  // set_keepalive on every stream
  std::set<std::string> nonces_seen_;
  Fd listener_;
  std::vector<std::unique_ptr<Arrival>> arrivals_;
  double connect_seconds_ = 0;
  Clock::time_point next_gone_check_{};
  Fd wake_fd_;  // an eventfd that wake() signals, polled with the links
  std::atomic<uint64_t> wakes_{0};
  TransportStats stats_;
  // How long wait() retries (yielding) before it blocks in poll(), when
  // eager; a polite wait blocks at once.
  Clock::duration spin_;
  bool eager_ = true;
  bool parked_ = false;
  Cause cause_ = Cause::kNone;
  // The ring neighbours (connect_ring), whose links abort() parks; -1: none.
  int ring_right_ = -1;
  int ring_left_ = -1;
  int links_reused_ = 0;
};

// The address of the local interface that routes to `host` (no packet is sent).
std::string local_ip_towards(const std::string& host);

// How many streams links into a rank whose address is `local_ip` should have
// when not told (RINGREDUCE_TCP_STREAMS unset): from the speed of the NIC with
// that address (/sys/class/net/<nic>/speed): 8 from 100 Gbit/s, 4 from 40, 2
// from 25, else 1 (also for loopback and NICs that report no speed).
int default_tcp_streams(const std::string& local_ip);

}  // namespace rr
