// A transport that passes everything to another and counts the bytes it
// posts to and from ranks on other hosts: what crosses the network between
// hosts, whatever link kind carries it (stats() "bytes_sent_between_hosts").
// Counted when posted; a collective that completes has moved them all.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "transport/transport.h"

namespace rr {

class CountingTransport : public Transport {
 public:
  // `remote[r]`: rank r is on another host.
  CountingTransport(std::unique_ptr<Transport> inner, std::vector<bool> remote);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  RequestPtr irecv_view(int peer, size_t bytes) override;
  void release(Request& view) override { inner_->release(view); }
  MemoryRange view_region(int peer, size_t bytes) override {
    return inner_->view_region(peer, bytes);
  }
  MemoryRange lend_region(int peer) override { return inner_->lend_region(peer); }
  char* lend(int peer, size_t bytes) override { return inner_->lend(peer, bytes); }
  RequestPtr isend_lent(int peer, char* lent, size_t bytes) override;
  void wait(Request& request, const Deadline& deadline) override {
    inner_->wait(request, deadline);
  }
  bool progress() override { return inner_->progress(); }
  bool wait_for(Request& request, std::chrono::microseconds slice) override {
    return inner_->wait_for(request, slice);
  }
  void wake() override { inner_->wake(); }
  void set_eager(bool eager) override { inner_->set_eager(eager); }
  bool reaches(int peer) const override { return inner_->reaches(peer); }
  bool connects(int peer) const override { return inner_->connects(peer); }
  void abort() noexcept override { inner_->abort(); }
  void note_silent() noexcept override { inner_->note_silent(); }
  void close() noexcept override { inner_->close(); }
  TransportStats stats() const override { return inner_->stats(); }
  uint64_t moved(int peer, bool sending) const override { return inner_->moved(peer, sending); }
  void parts(std::vector<Transport*>& out) override { inner_->parts(out); }

  // Bytes posted to and from ranks on other hosts.
  TransportStats between_hosts() const;

 private:
  bool remote(int peer) const;

  std::unique_ptr<Transport> inner_;
  std::vector<bool> remote_;
  std::atomic<uint64_t> sent_{0}, received_{0};
};

}  // namespace rr
