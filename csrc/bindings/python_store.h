// The engine's Store over a Python object (PythonStore), and a store's values as
// Python sees them: what the bindings of communicators and stores share.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store.h"

namespace rr {

namespace py = pybind11;

// A store's values as Python sees them: bytes, or None where a key is not set.
inline py::list bytes_or_none(const std::vector<std::optional<std::string>>& values) {
  py::list out;
  for (const auto& v : values) out.append(v ? py::object(py::bytes(*v)) : py::none());
  return out;
}

// The engine's store over a Python object with set(key, value),
// try_get(key) -> bytes or None, and set_if_absent(key, value) -> bytes: how a
// torch.distributed store (ringreduce.torch) serves our rendezvous. Calls come
// from whichever thread the engine runs on, so each takes the GIL.
class PythonStore final : public Store {
 public:
  explicit PythonStore(py::object impl) : impl_(std::move(impl)) {}
  ~PythonStore() override {
    if (Py_IsInitialized() == 0) {
      impl_.release();  // the interpreter is gone: nothing to give the object back to
      return;
    }
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    impl_.attr("set")(key, py::bytes(value));
  }
  std::optional<std::string> try_get(const std::string& key) override {
    py::gil_scoped_acquire gil;
    py::object value = impl_.attr("try_get")(key);
    if (value.is_none()) return std::nullopt;
    return value.cast<std::string>();
  }
  std::string set_if_absent(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    return impl_.attr("set_if_absent")(key, py::bytes(value)).cast<std::string>();
  }
  // Optional on the Python side: claim(key, value) -> bytes (rr::Store::claim);
  // otherwise set_if_absent.
  std::string claim(const std::string& key, const std::string& value) override {
    {
      py::gil_scoped_acquire gil;
      if (py::hasattr(impl_, "claim")) {
        return impl_.attr("claim")(key, py::bytes(value)).cast<std::string>();
      }
    }
    return set_if_absent(key, value);
  }
  // Optional on the Python side: set_many(items), a list of (key, bytes) set together
  // (rr::Store::set_many); otherwise one set each.
  void set_many(const std::vector<std::pair<std::string, std::string>>& items) override {
    {
      py::gil_scoped_acquire gil;
      if (py::hasattr(impl_, "set_many")) {
        py::list pairs;
        for (const auto& [key, value] : items) pairs.append(py::make_tuple(key, py::bytes(value)));
        impl_.attr("set_many")(pairs);
        return;
      }
    }
    rr::Store::set_many(items);
  }
  // Optional on the Python side: try_get_many(keys) -> list of bytes or None, the
  // keys read together (rr::Store::try_get_many); otherwise one try_get each.
  std::vector<std::optional<std::string>> try_get_many(
      const std::vector<std::string>& keys) override {
    {
      py::gil_scoped_acquire gil;
      if (py::hasattr(impl_, "try_get_many")) {
        py::list values = impl_.attr("try_get_many")(keys);
        if (values.size() != keys.size()) {
          throw rr::Error("store: try_get_many returned " + std::to_string(values.size()) +
                          " values for " + std::to_string(keys.size()) + " keys");
        }
        std::vector<std::optional<std::string>> out;
        for (py::handle v : values) {
          out.push_back(v.is_none() ? std::nullopt
                                    : std::optional<std::string>(v.cast<std::string>()));
        }
        return out;
      }
    }
    return rr::Store::try_get_many(keys);
  }
  // Optional on the Python side: wait_get(key, ms) -> bytes or None, a get that
  // may wait up to ms for the key (a store whose server can hold a request).
  bool can_wait() const override {
    if (Py_IsInitialized() == 0) return false;
    py::gil_scoped_acquire gil;
    return py::hasattr(impl_, "wait_get");
  }
  std::optional<std::string> wait_get(const std::string& key,
                                      std::chrono::milliseconds slice) override {
    py::gil_scoped_acquire gil;
    py::object value = impl_.attr("wait_get")(key, static_cast<int>(slice.count()));
    if (value.is_none()) return std::nullopt;
    return value.cast<std::string>();
  }
  // Optional on the Python side: a store that knows whether it is served in
  // this process, whether its host's process is gone, and whether its host's
  // machine answers nothing (rr::Store's meanings).
  bool hosted_here() const override { return ask("hosted_here"); }
  bool host_lost() const override { return ask("host_lost"); }
  bool host_unreachable() const override { return ask("host_unreachable"); }
  bool ends_with_attempt() const override {
    if (Py_IsInitialized() == 0) return false;
    {
      py::gil_scoped_acquire gil;
      if (!py::hasattr(impl_, "ends_with_attempt")) return hosted_here();
    }
    return ask("ends_with_attempt");
  }
  bool peer_gone(int peer) const override {
    if (Py_IsInitialized() == 0) return false;
    py::gil_scoped_acquire gil;
    try {
      return py::hasattr(impl_, "peer_gone") && impl_.attr("peer_gone")(peer).cast<bool>();
    } catch (const py::error_already_set&) {
      return false;
    }
  }
  // Optional on the Python side: peer_look_ms() -> int, how often to ask
  // peer_gone while waiting for a rank's key (rr::Store::peer_look).
  std::chrono::milliseconds peer_look() const override {
    if (Py_IsInitialized() == 0) return rr::kPeerLook;
    py::gil_scoped_acquire gil;
    try {
      if (!py::hasattr(impl_, "peer_look_ms")) return rr::kPeerLook;
      const int ms = impl_.attr("peer_look_ms")().cast<int>();
      return std::chrono::milliseconds(std::clamp(ms, 1, 1000));
    } catch (const py::error_already_set&) {
      return rr::kPeerLook;
    }
  }

 private:
  bool ask(const char* name) const {
    if (Py_IsInitialized() == 0) return false;
    py::gil_scoped_acquire gil;
    try {
      return py::hasattr(impl_, name) && impl_.attr(name)().cast<bool>();
    } catch (const py::error_already_set&) {
      return false;
    }
  }

  py::object impl_;
};

}  // namespace rr
