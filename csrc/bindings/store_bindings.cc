// Stores as ringreduce._core sees them: TcpStore, the TCP key-value store every rank of
// a fault-tolerant communicator serves (its standby store), as a Python object.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "python_store.h"
#include "rendezvous/store.h"

namespace py = pybind11;

namespace {

using rr::bytes_or_none;

// A TCP store as a Python object: the standby store every rank of a
// fault-tolerant communicator serves, where the survivors meet to agree and
// shrink when the rendezvous store died with its host (ringreduce._comm.membership.agreement).
class PyTcpStore {
 public:
  PyTcpStore(const std::string& host, int port, bool is_server, double timeout, double io_seconds,
             const std::string& token, int keepalive_seconds) {
    int chosen = port;
    py::gil_scoped_release release;
    store_ = rr::make_tcp_store(
        host, port, is_server, rr::Deadline::after(timeout), io_seconds, token,
        [&chosen](int p) { chosen = p; }, 0, keepalive_seconds);
    port_ = chosen;
  }
  int port() const { return port_; }
  void set(const std::string& key, const py::bytes& value) {
    std::string v = value;
    py::gil_scoped_release release;
    live().set(key, v);
  }
  py::object try_get(const std::string& key) {
    std::optional<std::string> v;
    {
      py::gil_scoped_release release;
      v = live().try_get(key);
    }
    if (!v) return py::none();
    return py::bytes(*v);
  }
  py::object wait_get(const std::string& key, int ms) {
    std::optional<std::string> v;
    {
      py::gil_scoped_release release;
      v = live().wait_get(key, std::chrono::milliseconds(ms));
    }
    if (!v) return py::none();
    return py::bytes(*v);
  }
  py::bytes claim(const std::string& key, const py::bytes& value) {
    std::string v = value, out;
    {
      py::gil_scoped_release release;
      out = live().claim(key, v);
    }
    return py::bytes(out);
  }
  void set_many(const std::vector<std::pair<std::string, py::bytes>>& items) {
    std::vector<std::pair<std::string, std::string>> kv;
    for (const auto& [key, value] : items) kv.emplace_back(key, std::string(value));
    py::gil_scoped_release release;
    live().set_many(kv);
  }
  py::list try_get_many(const std::vector<std::string>& keys) {
    std::vector<std::optional<std::string>> got;
    {
      py::gil_scoped_release release;
      got = live().try_get_many(keys);
    }
    return bytes_or_none(got);
  }
  py::bytes set_if_absent(const std::string& key, const py::bytes& value) {
    std::string v = value, out;
    {
      py::gil_scoped_release release;
      out = live().set_if_absent(key, v);
    }
    return py::bytes(out);
  }
  size_t erase_prefix(const std::string& prefix) { return live().erase_prefix(prefix); }
  size_t key_count() { return live().key_count(); }
  bool host_lost() const { return store_ && store_->host_lost(); }
  bool host_unreachable() const { return store_ && store_->host_unreachable(); }
  void set_host_stop_check(bool on) { live().set_host_stop_check(on); }
  // A served store stops taking new connections (its port is free again);
  // clients already connected go on.
  void seal() {
    if (store_) store_->seal();
  }
  void close() {
    py::gil_scoped_release release;
    store_.reset();
  }

 private:
  rr::Store& live() {
    if (!store_) throw rr::Error("the store is closed");
    return *store_;
  }
  std::unique_ptr<rr::Store> store_;
  int port_ = 0;
};

}  // namespace

void register_stores(py::module_& m) {
  py::class_<PyTcpStore>(m, "TcpStore",
                         "A TCP key-value store: is_server=True serves one on host:port (port 0: "
                         "the kernel picks; see .port) and connects to it; False connects to one. "
                         "With a token, both sides prove they hold it.")
      .def(py::init<const std::string&, int, bool, double, double, const std::string&, int>(),
           py::arg("host"), py::arg("port"), py::arg("is_server"), py::arg("timeout"),
           py::arg("io_seconds"), py::arg("token") = "", py::arg("keepalive_seconds") = 0,
           "keepalive_seconds > 0: a request fails (and host_unreachable() is True) once the "
           "server's machine answers no TCP keepalive probe for about that long.")
      .def_property_readonly("port", &PyTcpStore::port)
      .def("set", &PyTcpStore::set, py::arg("key"), py::arg("value"))
      .def("try_get", &PyTcpStore::try_get, py::arg("key"))
      .def("claim", &PyTcpStore::claim, py::arg("key"), py::arg("value"),
           "set_if_absent without telling the other clients (a seat).")
      .def("set_many", &PyTcpStore::set_many, py::arg("items"),
           "set of each (key, value), in order, in one round trip.")
      .def("try_get_many", &PyTcpStore::try_get_many, py::arg("keys"),
           "try_get of each key, in order (None where missing), in one round trip.")
      .def("wait_get", &PyTcpStore::wait_get, py::arg("key"), py::arg("ms"),
           "The value of key, or None once ms milliseconds (at most 1000) passed without "
           "it: the server holds the request until the key is set.")
      .def("set_if_absent", &PyTcpStore::set_if_absent, py::arg("key"), py::arg("value"))
      .def("erase_prefix", &PyTcpStore::erase_prefix, py::arg("prefix"),
           "On the store's host: drops every key that starts with prefix; how many.")
      .def("key_count", &PyTcpStore::key_count, "On the store's host: how many keys it holds.")
      .def("host_lost", &PyTcpStore::host_lost)
      .def("host_unreachable", &PyTcpStore::host_unreachable,
           "The server's machine answered nothing (keepalive probes or retransmissions): "
           "cut off by the network, frozen or powered off.")
      .def("set_host_stop_check", &PyTcpStore::set_host_stop_check, py::arg("on"),
           "While on, a request fails once this machine sees the store's host stopped "
           "(as during a failure report); off, it waits up to io_seconds.")
      .def("seal", &PyTcpStore::seal,
           "Serving: take no new connections and free the port; connected clients go on.")
      .def("close", &PyTcpStore::close);
}
