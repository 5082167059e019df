// The file store: one file per key in a shared directory. Writes go to a
// temporary name and are published with link()/rename(), so readers never see
// a half-written value.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "rendezvous/store.h"

namespace rr {
namespace {

class FileStore : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
    if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      throw Error(errno_message("cannot create store directory " + dir_, errno));
    }
  }

  void set(const std::string& key, const std::string& value) override {
    std::string tmp = write_temp(key, value);
    if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
      throw Error(errno_message("file store: cannot publish key " + key, errno));
    }
  }

  std::optional<std::string> try_get(const std::string& key) override {
    std::ifstream in(path(key), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    std::string tmp = write_temp(key, value);
    int rc = ::link(tmp.c_str(), path(key).c_str());
    ::unlink(tmp.c_str());
    if (rc != 0 && errno != EEXIST) {
      throw Error(errno_message("file store: cannot publish key " + key, errno));
    }
    return try_get(key).value_or(value);
  }

 private:
  // Keys may contain '/', which is not allowed in a file name.
  std::string path(const std::string& key) const {
    std::string name = key;
    for (char& ch : name) {
      if (ch == '/') ch = '.';
    }
    return dir_ + "/" + name;
  }

  std::string write_temp(const std::string& key, const std::string& value) {
    std::string tmp = path(key) + ".tmp." + std::to_string(::getpid()) + "." +
                      std::to_string(counter_++);
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) throw Error("file store: cannot write " + tmp);
    return tmp;
  }

  std::string dir_;
  unsigned counter_ = 0;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& directory) {
  return std::make_unique<FileStore>(directory);
}

}  // namespace rr
