#include "transport/mpi/mpi_store.h"

namespace rr {
namespace {

class MpiStore : public Store {
 public:
  explicit MpiStore(std::shared_ptr<MpiChannel> channel) : channel_(std::move(channel)) {}

  void set(const std::string& key, const std::string& value) override {
    channel_->put(key, value);
    channel_->publish(key, value);
  }

  std::optional<std::string> try_get(const std::string& key) override {
    channel_->poll();
    return channel_->value(key);
  }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    channel_->mark_failed();
    channel_->poll();
    bool inserted = false;
    std::string held = channel_->put_if_absent(key, value, &inserted);
    if (inserted) channel_->publish(key, value);
    return held;
  }

 private:
  std::shared_ptr<MpiChannel> channel_;
};

}  // namespace

std::unique_ptr<Store> make_mpi_store(std::shared_ptr<MpiChannel> channel) {
  return std::make_unique<MpiStore>(std::move(channel));
}

}  // namespace rr
