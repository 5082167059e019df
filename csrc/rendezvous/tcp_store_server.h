// The TCP store's server: the hosting rank's end of the rendezvous store, serving
// every client from a thread of its own (tcp_store_server.cc; the wire format and
// handshake: store_protocol.h; the client: tcp_store.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/socket.h"

namespace rr {

class StoreServer {
 public:
  // Serves on `listener` (clients prove `token` first, when it is not empty) until
  // destroyed; the destructor wakes the thread and waits for it.
  StoreServer(Fd listener, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The thread closes the listening socket on its next round: no new clients.
  void stop_accepting();
  int port() const;
  // Drops every key that starts with `prefix` (keys no reader needs any more), so
  // that a store which outlives many rounds does not grow with them; the number of
  // keys dropped. Safe from any thread.
  size_t erase_prefix(const std::string& prefix);
  // How many keys the store holds now.
  size_t key_count();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace rr
