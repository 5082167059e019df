// Rendezvous: a key-value store the ranks share while they bootstrap, and
// afterwards as an out-of-band channel for failure reports (so a rank whose
// neighbour vanished can say which rank failed first).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"

namespace rr {

// How every rendezvous wait polls the store: every 1-2 ms for its first 100 ms,
// since ranks that are all running (a shrink, the steps of one bootstrap) meet
// within milliseconds and each step of a bootstrap waits on the last; then
// doubling up to 50 ms, for a rank that is still starting, so that a job's ranks
// do not flood rank 0's store while they wait for a slow one.
// How often a wait for a rank's key asks Store::peer_gone about that rank.
constexpr std::chrono::milliseconds kPeerLook{50};

class PollBackoff {
 public:
  // Sleeps until the next look (never past the deadline).
  void sleep(const Deadline& deadline);
  // News arrived: poll quickly again.
  void reset();

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int ms_ = 1;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value, or nothing if the key is not set yet. Never blocks for long.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // try_get of each key, in order; where the store can, in one round trip (the
  // TCP store sends the requests together), so that reading every rank's key
  // costs one round trip, not one per rank.
  virtual std::vector<std::optional<std::string>> try_get_many(
      const std::vector<std::string>& keys);
  // set() of each (key, value), in order; where the store can, in one round trip.
  virtual void set_many(const std::vector<std::pair<std::string, std::string>>& items);
  // Stores `value` unless the key exists; returns whichever value the key
  // holds afterwards. This is how ranks agree on "the first failure".
  virtual std::string set_if_absent(const std::string& key, const std::string& value) = 0;
  // set_if_absent for a key only its setter reads back (a seat): a store that
  // tells every client each first value set (the TCP store's notices, which
  // carry the first failure) need not tell this one.
  virtual std::string claim(const std::string& key, const std::string& value) {
    return set_if_absent(key, value);
  }

  // True when wait_get can hold a request until its key is set (the TCP store).
  virtual bool can_wait() const { return false; }
  // The value of `key`, waiting up to `slice` for it to be set where the store
  // can (can_wait); otherwise try_get.
  virtual std::optional<std::string> wait_get(const std::string& key,
                                              std::chrono::milliseconds slice) {
    (void)slice;
    return try_get(key);
  }

  // One look for `key` in a wait loop: where the store can hold the request, a
  // wait of up to `slice` (never past `deadline`); elsewhere one look, and a
  // sleep as `backoff` says when the key is not there yet.
  std::optional<std::string> look_for(const std::string& key, std::chrono::milliseconds slice,
                                      PollBackoff& backoff, const Deadline& deadline);

  // Waits until `key` is set. Throws TimeoutError naming the key at the deadline,
  // blaming `peer` (the rank that should have set it) when given; and PeerError
  // as soon as peer_gone(peer).
  std::string get(const std::string& key, const Deadline& deadline, int peer = -1);
  // get() of every key, `peers[i]` the rank that sets keys[i] (or -1): the values
  // in order. Those already set are read together, one round trip where the
  // store can; for the first one missing it waits as get() does (the same errors,
  // naming that rank), or as `wait(i)` does where given, then reads the rest
  // together again.
  using WaitFor = std::function<std::string(size_t index)>;
  std::vector<std::string> get_all(const std::vector<std::string>& keys, const Deadline& deadline,
                                   const std::vector<int>& peers = {},
                                   const WaitFor& wait = nullptr);

  // Every rank of the communicator has connected: a store served here takes
  // no new connections from now on, so that a rank that closed this
  // communicator and makes the next one on the same address meets the next
  // store, not this one on its way out. (Connections made stay open.)
  virtual void seal() {}

  // True when this process serves the store, so that it ends with us.
  virtual bool hosted_here() const { return false; }
  // Where this process serves the store (hosted_here()): drops every key that
  // starts with `prefix` and returns how many (a store that outlives many
  // rounds of agreement forgets the rounds no one reads any more); and how
  // many keys it holds. Anywhere else: InvalidArgument.
  virtual size_t erase_prefix(const std::string& prefix);
  virtual size_t key_count();
  // True when the store goes away if making the communicator fails here (the
  // process then ends): the maker stays a moment, so that the others read why.
  // Not so for a store that outlives the attempt (a shrink's meeting store).
  virtual bool ends_with_attempt() const { return hosted_here(); }
  // True once the store's host closed our connection without a goodbye: its
  // process is gone (killed, crashed, or exited).
  virtual bool host_lost() const { return false; }
  // True once the store's host's machine acknowledged nothing of a request
  // for the keepalive time (a partition, a frozen or powered-off host; see
  // make_tcp_store): host_lost() is then true too.
  virtual bool host_unreachable() const { return false; }
  // While on, a request whose host this machine sees stopped (SIGSTOP, a
  // debugger) for a moment fails instead of waiting for the I/O timeout: a
  // failure report turns it on, since a stopped host is then the likely
  // culprit and the report must name someone. Off otherwise, so that a host
  // paused by a debugger or a profiler is waited for. Turning it on forgets
  // an earlier finding.
  virtual void set_host_stop_check(bool /*on*/) {}
  // True once a request, while the check was on, found the host stopped.
  virtual bool host_stopped() const { return false; }
  // True when rank `peer` of the communicator being made is known to be gone
  // (a store that can tell: the members' store of a shrink or grow). A wait for a
  // key that rank sets then fails at once, naming it, instead of at the deadline.
  virtual bool peer_gone(int /*peer*/) const { return false; }
  // How often a wait for a rank's key asks peer_gone about it (and so the
  // longest a held wait lasts): kPeerLook, or less where looking is cheap and
  // the ranks few (a shrink's meeting: a second death during a shrink is then
  // named within milliseconds, not a twentieth of a second).
  virtual std::chrono::milliseconds peer_look() const { return kPeerLook; }
};

// The values of keys `prefix + r` that ranks r set, for every r in `ranks` but
// `except`, in that order (Store::get_all, each wait naming its rank).
std::vector<std::string> get_of_ranks(Store& store, const std::string& prefix,
                                      const std::vector<int>& ranks, int except,
                                      const Deadline& deadline);

// The host stop check, on for a scope: while a rank works out and reports
// why a collective failed.
class HostStopCheck {
 public:
  explicit HostStopCheck(Store& store) : store_(store) { store_.set_host_stop_check(true); }
  ~HostStopCheck() { store_.set_host_stop_check(false); }
  HostStopCheck(const HostStopCheck&) = delete;
  HostStopCheck& operator=(const HostStopCheck&) = delete;

 private:
  Store& store_;
};

// A store hosted by one rank: `is_server` ranks run the server on host:port,
// everybody (the host included) connects to it as a client. Each request gives
// up after `io_seconds`, so a failure report to an unreachable store cannot
// delay the error it reports for long. With a `token`, every client proves it
// holds the same one before its first request (AuthenticationError if not).
// The server listens on loopback only when `host` is a loopback address.
// With port 0 the server listens on a port the kernel picks, and tells
// `listening` which, before it waits for anyone (the caller passes it on to
// the other ranks: no probing for a free port that someone may take first).
// A fixed port that is in use is tried again for up to `busy_port_seconds`
// (the job's own MASTER_PORT: its previous store may still be closing); 0 for
// a port picked at random, where the caller tries another. `keepalive_seconds`:
// a request fails when the server's machine answers nothing for that long (a
// network partition; common/socket.h, set_request_keepalive), 0: at `io_seconds`.
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      const Deadline& deadline, double io_seconds,
                                      const std::string& token = "",
                                      const std::function<void(int)>& listening = {},
                                      double busy_port_seconds = 0, int keepalive_seconds = 0);

// A store in this process's memory: for a world of one, and for tests.
std::unique_ptr<Store> make_local_store();

// A store in a directory visible to every rank (a shared file system).
std::unique_ptr<Store> make_file_store(const std::string& directory);

}  // namespace rr
