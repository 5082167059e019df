#include "rendezvous/store.h"

#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace rr {

std::string Store::get(const std::string& key, const Deadline& deadline) {
  int sleep_ms = 1;
  while (true) {
    if (auto value = try_get(key)) return *value;
    if (deadline.expired()) {
      throw TimeoutError("timed out after " + format_seconds(deadline.seconds()) +
                             " s waiting for rendezvous key '" + key + "'",
                         -1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.poll_ms(sleep_ms)));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
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
