// Rendezvous: a key-value store the ranks share while they bootstrap, and
// afterwards as an out-of-band channel for failure reports (so a rank whose
// neighbour vanished can say which rank failed first).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/deadline.h"

namespace rr {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value, or nothing if the key is not set yet. Never blocks for long.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Stores `value` unless the key exists; returns whichever value the key
  // holds afterwards. This is how ranks agree on "the first failure".
  virtual std::string set_if_absent(const std::string& key, const std::string& value) = 0;

  // Waits until `key` is set. Throws TimeoutError naming the key at the deadline.
  std::string get(const std::string& key, const Deadline& deadline);

  // Every rank of the communicator has connected: a store served here takes
  // no new connections from now on, so that a rank that closed this
  // communicator and makes the next one on the same address meets the next
  // store, not this one on its way out. (Connections made stay open.)
  virtual void seal() {}

  // True when this process serves the store, so that it ends with us.
  virtual bool hosted_here() const { return false; }
  // True once the store's host closed our connection without a goodbye: its
  // process is gone (killed, crashed, or exited).
  virtual bool host_lost() const { return false; }
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
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      const Deadline& deadline, double io_seconds,
                                      const std::string& token = "",
                                      const std::function<void(int)>& listening = {});

// A store in this process's memory: for a world of one, and for tests.
std::unique_ptr<Store> make_local_store();

// A store in a directory visible to every rank (a shared file system).
std::unique_ptr<Store> make_file_store(const std::string& directory);

}  // namespace rr
