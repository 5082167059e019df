#include "common/error.h"

#include <cstring>

namespace rr {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace rr
