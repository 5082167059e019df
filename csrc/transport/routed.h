// A transport made of others, one per kind of link: each peer is reached
// through the first part that reaches it (shared memory on this host, then
// TCP or MPI to other hosts). The algorithms see one transport; its name
// says what runs, e.g. "shm+tcp".
//
// A wait drives every part, not only the one carrying the awaited request,
// so a send to another host keeps moving while we wait on a neighbour on
// this host: it waits on the awaited request's part in short slices
// (Transport::wait_for) and progresses the others in between.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace rr {

class RoutedTransport : public Transport {
 public:
  // `parts` in order of preference; the last (the network) carries what no
  // other reaches.
  RoutedTransport(std::vector<std::unique_ptr<Transport>> parts, std::string name);
  ~RoutedTransport() override;

  int rank() const override { return parts_.front()->rank(); }
  int size() const override { return parts_.front()->size(); }
  const char* name() const override { return name_.c_str(); }

  RequestPtr isend(int peer, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, void* data, size_t bytes) override;
  RequestPtr irecv_view(int peer, size_t bytes) override;
  void release(Request& view) override;
  MemoryRange view_region(int peer, size_t bytes) override;
  MemoryRange lend_region(int peer) override;
  char* lend(int peer, size_t bytes) override;
  RequestPtr isend_lent(int peer, char* lent, size_t bytes) override;
  void wait(Request& request, const Deadline& deadline) override;
  bool progress() override;
  bool wait_for(Request& request, std::chrono::microseconds slice) override;
  bool reaches(int peer) const override;
  bool connects(int peer) const override;
  void wake() override;
  void set_eager(bool eager) override;
  void abort() noexcept override;
  void note_silent() noexcept override {
    for (auto& part : parts_) part->note_silent();
  }
  void close() noexcept override;
  TransportStats stats() const override;
  // The part that reaches `peer` says.
  uint64_t moved(int peer, bool sending) const override;
  void parts(std::vector<Transport*>& out) override {
    for (auto& part : parts_) part->parts(out);
  }

 private:
  Transport& part_for(int peer);

  std::vector<std::unique_ptr<Transport>> parts_;
  std::vector<Transport*> route_;  // by peer rank
  std::string name_;
};

}  // namespace rr
