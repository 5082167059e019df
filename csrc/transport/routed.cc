#include "transport/routed.h"

#include <algorithm>

#include "common/error.h"
#include "transport/waiter.h"

namespace rr {
namespace {

// How long a wait stays on the awaited request's part before it gives the
// other parts a turn.
constexpr std::chrono::microseconds kSlice{1000};

}  // namespace

RoutedTransport::RoutedTransport(std::vector<std::unique_ptr<Transport>> parts, std::string name)
    : parts_(std::move(parts)), name_(std::move(name)) {
  const int n = parts_.front()->size();
  route_.assign(static_cast<size_t>(n), nullptr);
  for (int peer = 0; peer < n; ++peer) {
    // The network transport, last, takes whoever the others do not reach
    // (a ring transport connects only the neighbours it needs, one way each).
    route_[static_cast<size_t>(peer)] = parts_.back().get();
    for (auto& part : parts_) {
      if (part->reaches(peer)) {
        route_[static_cast<size_t>(peer)] = part.get();
        break;
      }
    }
  }
}

RoutedTransport::~RoutedTransport() = default;

Transport& RoutedTransport::part_for(int peer) {
  Transport* part = peer >= 0 && peer < size() ? route_[static_cast<size_t>(peer)] : nullptr;
  if (part == nullptr) {
    throw Error(name_ + " transport: rank " + std::to_string(rank()) + " has no link to rank " +
                std::to_string(peer));
  }
  return *part;
}

RequestPtr RoutedTransport::isend(int peer, const void* data, size_t bytes) {
  return part_for(peer).isend(peer, data, bytes);
}

RequestPtr RoutedTransport::irecv(int peer, void* data, size_t bytes) {
  return part_for(peer).irecv(peer, data, bytes);
}

RequestPtr RoutedTransport::irecv_view(int peer, size_t bytes) {
  return part_for(peer).irecv_view(peer, bytes);
}

void RoutedTransport::release(Request& view) { part_for(view.peer()).release(view); }

MemoryRange RoutedTransport::view_region(int peer, size_t bytes) {
  return part_for(peer).view_region(peer, bytes);
}

MemoryRange RoutedTransport::lend_region(int peer) { return part_for(peer).lend_region(peer); }

char* RoutedTransport::lend(int peer, size_t bytes) { return part_for(peer).lend(peer, bytes); }

RequestPtr RoutedTransport::isend_lent(int peer, char* lent, size_t bytes) {
  return part_for(peer).isend_lent(peer, lent, bytes);
}

bool RoutedTransport::reaches(int peer) const {
  return peer >= 0 && peer < size() && route_[static_cast<size_t>(peer)]->reaches(peer);
}

bool RoutedTransport::connects(int peer) const {
  return peer >= 0 && peer < size() && route_[static_cast<size_t>(peer)]->connects(peer);
}

void RoutedTransport::wake() {
  for (auto& part : parts_) part->wake();
}

bool RoutedTransport::progress() {
  bool moved = false;
  for (auto& part : parts_) moved |= part->progress();
  return moved;
}

bool RoutedTransport::wait_for(Request& request, std::chrono::microseconds slice) {
  Transport& owner = part_for(request.peer());
  for (auto& part : parts_) {
    if (part.get() != &owner) part->progress();
  }
  return owner.wait_for(request, slice);
}

namespace {

// The waiter's view of a wait on a transport of several parts: progress is
// what moved with the awaited request's peer, as its part counts it (traffic
// with other peers, on that part or another, never renews a stalled wait, so
// the rank that waits on a stalled peer times out first and names it);
// sleeping is that part's own bounded wait (wait_for), after the other parts
// had a turn, so that a peer on another part waiting on us is not starved. A
// part that learns its peer is gone raises from there.
struct PartWaiting final : Waitable {
  PartWaiting(RoutedTransport& routed, Transport& owner, Request& request)
      : routed(routed), owner(owner), request(request) {}
  bool done() const override { return request.done(); }
  void progress() override { routed.progress(); }
  uint64_t moved() const override { return owner.moved(request.peer(), request.sending()); }
  void pause() override {}
  void block(uint32_t, std::chrono::microseconds bound) override {
    routed.wait_for(request, std::min(bound, kSlice));
  }
  void timed_out(const Deadline& window) override {
    throw_no_progress(window, request.what(), owner.name(), request.peer());
  }
  WaitContext context() const override { return {routed.rank(), request.what(), owner.name()}; }

  RoutedTransport& routed;
  Transport& owner;
  Request& request;
};

}  // namespace

void RoutedTransport::wait(Request& request, const Deadline& deadline) {
  if (request.done()) return;
  Transport& owner = part_for(request.peer());
  if (parts_.size() == 1) return owner.wait(request, deadline);
  PartWaiting waiting(*this, owner, request);
  WaitPolicy policy;  // no spinning of its own: the parts' wait_for spin
  policy.max_sleep = kSlice;
  wait_until_done(waiting, deadline, policy);
}

void RoutedTransport::set_eager(bool eager) {
  for (auto& part : parts_) part->set_eager(eager);
}

void RoutedTransport::abort() noexcept {
  for (auto& part : parts_) part->abort();
}

void RoutedTransport::close() noexcept {
  for (auto& part : parts_) part->close();
}

uint64_t RoutedTransport::moved(int peer, bool sending) const {
  if (peer < 0 || peer >= size()) return 0;
  return route_[static_cast<size_t>(peer)]->moved(peer, sending);
}

TransportStats RoutedTransport::stats() const {
  TransportStats total;
  for (const auto& part : parts_) {
    const TransportStats s = part->stats();
    total.bytes_sent += s.bytes_sent;
    total.bytes_received += s.bytes_received;
    total.tcp_links_reused += s.tcp_links_reused;
    total.tcp_links_connected += s.tcp_links_connected;
    total.shm_peers_reused += s.shm_peers_reused;
  }
  return total;
}

}  // namespace rr
