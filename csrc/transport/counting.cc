#include "transport/counting.h"

namespace rr {

CountingTransport::CountingTransport(std::unique_ptr<Transport> inner, std::vector<bool> remote)
    : inner_(std::move(inner)), remote_(std::move(remote)) {}

bool CountingTransport::remote(int peer) const {
  return peer >= 0 && static_cast<size_t>(peer) < remote_.size() &&
         remote_[static_cast<size_t>(peer)];
}

RequestPtr CountingTransport::isend(int peer, const void* data, size_t bytes) {
  RequestPtr request = inner_->isend(peer, data, bytes);
  if (remote(peer)) sent_.fetch_add(bytes, std::memory_order_relaxed);
  return request;
}

RequestPtr CountingTransport::irecv(int peer, void* data, size_t bytes) {
  RequestPtr request = inner_->irecv(peer, data, bytes);
  if (remote(peer)) received_.fetch_add(bytes, std::memory_order_relaxed);
  return request;
}

RequestPtr CountingTransport::irecv_view(int peer, size_t bytes) {
  RequestPtr request = inner_->irecv_view(peer, bytes);
  if (remote(peer)) received_.fetch_add(bytes, std::memory_order_relaxed);
  return request;
}

RequestPtr CountingTransport::isend_lent(int peer, char* lent, size_t bytes) {
  RequestPtr request = inner_->isend_lent(peer, lent, bytes);
  if (remote(peer)) sent_.fetch_add(bytes, std::memory_order_relaxed);
  return request;
}

TransportStats CountingTransport::between_hosts() const {
  TransportStats s;
  s.bytes_sent = sent_.load(std::memory_order_relaxed);
  s.bytes_received = received_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace rr
