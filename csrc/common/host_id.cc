#include "common/host_id.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace rr {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

std::string host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return std::string(name) + "|" + first_line("/proc/sys/kernel/random/boot_id") + "|" +
         link_target("/proc/self/ns/net");
}

}  // namespace rr
