#include "rendezvous/store.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace rr {

void PollBackoff::sleep(const Deadline& deadline) {
  constexpr auto kQuick = std::chrono::milliseconds(100);
  const bool quick = std::chrono::steady_clock::now() - start_ < kQuick;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max(1, deadline.poll_ms(ms_))));
  ms_ = quick ? std::min(ms_ + 1, 2) : std::min(ms_ * 2, 50);
}

void PollBackoff::reset() {
  start_ = std::chrono::steady_clock::now();
  ms_ = 1;
}

size_t Store::erase_prefix(const std::string& prefix) {
  throw InvalidArgument("store: keys (here '" + prefix +
                        "...') are erased only by the process that serves the store");
}

size_t Store::key_count() {
  throw InvalidArgument("store: only the process that serves the store counts its keys");
}

std::optional<std::string> Store::look_for(const std::string& key, std::chrono::milliseconds slice,
                                           PollBackoff& backoff, const Deadline& deadline) {
  if (can_wait()) {
    return wait_get(key,
                    std::chrono::milliseconds(deadline.poll_ms(static_cast<int>(slice.count()))));
  }
  std::optional<std::string> value = try_get(key);
  if (!value) backoff.sleep(deadline);
  return value;
}

std::string Store::get(const std::string& key, const Deadline& deadline, int peer) {
  PollBackoff backoff;
  const std::chrono::milliseconds look = peer_look();
  auto next_look = std::chrono::steady_clock::now() + look;
  while (true) {
    // A held wait lasts a slice at most, so that the peer, the deadline and
    // Ctrl-C are still looked at every peer_look().
    if (auto value = look_for(key, look, backoff, deadline)) return *value;
    if (peer >= 0 && std::chrono::steady_clock::now() >= next_look) {
      next_look = std::chrono::steady_clock::now() + look;
      if (peer_gone(peer)) {
        throw PeerError("rank " + std::to_string(peer) + " is gone: it did not set rendezvous key '" +
                            key + "'",
                        peer);
      }
    }
    if (deadline.expired()) {
      const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) + " (" : "";
      throw TimeoutError("timed out after " + format_seconds(deadline.seconds()) +
                             " s waiting for " + whom + "rendezvous key '" + key + "'" +
                             (peer >= 0 ? ")" : ""),
                         peer);
    }
  }
}

std::vector<std::optional<std::string>> Store::try_get_many(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(try_get(key));
  return out;
}

void Store::set_many(const std::vector<std::pair<std::string, std::string>>& items) {
  for (const auto& [key, value] : items) set(key, value);
}

std::vector<std::string> Store::get_all(const std::vector<std::string>& keys,
                                        const Deadline& deadline, const std::vector<int>& peers,
                                        const WaitFor& wait) {
  if (!peers.empty() && peers.size() != keys.size()) {
    throw InvalidArgument("store get_all: " + std::to_string(peers.size()) + " ranks for " +
                          std::to_string(keys.size()) + " keys");
  }
  std::vector<std::optional<std::string>> got = try_get_many(keys);
  while (true) {
    std::vector<size_t> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!got[i]) missing.push_back(i);
    }
    if (missing.empty()) break;
    const size_t first = missing.front();
    got[first] = wait ? wait(first) : get(keys[first], deadline, peers.empty() ? -1 : peers[first]);
    if (missing.size() == 1) break;
    // Whoever else set theirs meanwhile: read together.
    std::vector<std::string> rest;
    for (size_t j = 1; j < missing.size(); ++j) rest.push_back(keys[missing[j]]);
    std::vector<std::optional<std::string>> more = try_get_many(rest);
    for (size_t j = 1; j < missing.size(); ++j) got[missing[j]] = std::move(more[j - 1]);
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& value : got) out.push_back(std::move(*value));
  return out;
}

std::vector<std::string> get_of_ranks(Store& store, const std::string& prefix,
                                      const std::vector<int>& ranks, int except,
                                      const Deadline& deadline) {
  std::vector<std::string> keys;
  std::vector<int> peers;
  for (int r : ranks) {
    if (r == except) continue;
    keys.push_back(prefix + std::to_string(r));
    peers.push_back(r);
  }
  return store.get_all(keys, deadline, peers);
}

namespace {

class LocalStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }
  std::string set_if_absent(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.emplace(key, value).first->second;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> data_;
};

}  // namespace

std::unique_ptr<Store> make_local_store() { return std::make_unique<LocalStore>(); }

}  // namespace rr
