#include "rendezvous/store.h"

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

}  // namespace rr
