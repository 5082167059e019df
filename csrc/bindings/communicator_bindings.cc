// The communicator as ringreduce._core sees it: Options, Communicator, Work.
//
// submit()/run() take raw addresses from the Python package, which has
// checked the arrays; the fast path of the most common call is in
// fast_path.cc.
//
// Blocking calls run on the calling thread with the GIL released; while they
// wait, a PythonInterrupt takes the GIL every 100 ms to let Python handle
// signals, so Ctrl-C ends a wait on a stuck peer with KeyboardInterrupt.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <tuple>

#include "common/error.h"
#include "engine/bootstrap.h"
#include "engine/communicator.h"
#include "kernels/codec.h"
#include "python_interrupt.h"
#include "python_store.h"
#include "rendezvous/store.h"

namespace py = pybind11;

namespace {

using rr::bytes_or_none;
using rr::PythonInterrupt;
using rr::PythonStore;

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// Block sizes and offsets of an uneven all_to_all, in elements, by rank:
// [send_counts, send_offsets, recv_counts, recv_offsets], or empty.
using Blocks = std::vector<std::vector<size_t>>;

// A compressed call's additions (rr::Compression), as the Python package hands
// them over: (kernel name or "exact", residual address or 0, call number, piece_values,
// sample address or 0, sample count, the canary's rows' address or 0, the
// name to count the call under, the canary's max_error).
using CompressionArgs =
    std::optional<std::tuple<std::string, uintptr_t, uint64_t, size_t, uintptr_t, size_t, uintptr_t,
                             std::string, double>>;

void add_compression(rr::CollectiveArgs& args, const CompressionArgs& given) {
  if (!given) {
    if (rr::compressed_kind(args.kind)) {
      throw rr::InvalidArgument("a compressed collective needs its codec (compression=)");
    }
    return;
  }
  if (!rr::compressed_kind(args.kind)) {
    throw rr::InvalidArgument(std::string("compression= is for the compressed collectives, not ") +
                              rr::collective_name(args.kind));
  }
  const auto& [codec, residual, call, piece_values, sample, sample_count, rows, name, max_error] =
      *given;
  rr::Compression& c = args.compression;
  // "exact": no codec, float32 rows (an exact sum that sends a residual along).
  c.codec = codec == "exact"
                ? 0
                : static_cast<uint8_t>(static_cast<int>(rr::codec::codec_kind(codec.c_str())) + 1);
  c.residual = static_cast<float*>(as_ptr(residual));
  c.call = call;
  c.piece_values = piece_values;
  c.sample = static_cast<const int64_t*>(as_ptr(sample));
  c.sample_count = sample ? sample_count : 0;
  c.rows = static_cast<float*>(as_ptr(rows));
  c.name = name.empty() ? codec : name;
  c.max_error = max_error;
  if (c.sample_count > 0 && c.rows == nullptr) {
    throw rr::InvalidArgument("compression: a canary sample needs its rows");
  }
  if (args.dtype != rr::DataType::kFloat32 && args.dtype != rr::DataType::kFloat16 &&
      args.dtype != rr::DataType::kBFloat16) {
    throw rr::InvalidArgument(
        std::string("compression is for float32, float16 and bfloat16, not ") +
        rr::dtype_name(args.dtype));
  }
  if (args.op != rr::ReduceOp::kSum && args.op != rr::ReduceOp::kAvg) {
    throw rr::InvalidArgument(std::string("compression supports sum and avg only, not ") +
                              rr::op_name(args.op));
  }
}

rr::CollectiveArgs make_args(rr::CollectiveKind kind, uintptr_t send, uintptr_t recv, size_t count,
                             rr::DataType dtype, rr::ReduceOp op, int root, int device,
                             uintptr_t stream, const Blocks& blocks = {}) {
  rr::CollectiveArgs args;
  if (!blocks.empty()) {
    if (blocks.size() != 4) throw std::invalid_argument("blocks: 4 lists expected");
    args.send_counts = blocks[0];
    args.send_offsets = blocks[1];
    args.recv_counts = blocks[2];
    args.recv_offsets = blocks[3];
  }
  args.kind = kind;
  args.send = as_ptr(send);
  args.recv = as_ptr(recv);
  args.count = count;
  args.dtype = dtype;
  args.op = op;
  args.root = root;
  args.device = device;
  args.stream = stream;
  return args;
}

py::dict stats(const rr::Communicator& self) {
  const rr::CommStats s = self.stats();
  py::dict d;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["ops"] = s.ops;
  py::dict algorithms;
  for (int a = 0; a < rr::kAlgorithms; ++a) {
    algorithms[rr::algorithm_name(static_cast<rr::Algorithm>(a))] = s.all_reduce_by_algorithm[a];
  }
  d["all_reduce_algorithms"] = algorithms;
  // What the collectives sent to and received from ranks on other hosts.
  d["bytes_sent_between_hosts"] = s.bytes_sent_between_hosts;
  d["bytes_received_between_hosts"] = s.bytes_received_between_hosts;
  // TCP ring links taken over from the communicator this one shrank from, and made anew.
  d["tcp_links_reused"] = s.tcp_links_reused;
  d["tcp_links_connected"] = s.tcp_links_connected;
  // Local peers whose shared memory was taken over the same way.
  d["shm_peers_reused"] = s.shm_peers_reused;
  // Bytes staged device calls copied onto the GPU straight out of shared memory.
  d["staged_in_place_bytes"] = s.staged_in_place_bytes;
  // Compressed collectives by codec name: their counters and the canary's (CodecCounters).
  py::dict codecs;
  for (const auto& [name, c] : s.codecs) {
    py::dict one;
    one["calls"] = c.calls;
    one["wire_bytes"] = c.wire_bytes;
    one["codec_seconds"] = c.seconds;
    one["pieces"] = c.pieces;
    one["canary_checks"] = c.canary_checks;
    one["compression_error"] = c.compression_error;
    one["worst_error"] = c.worst_error;
    one["bias"] = c.bias;
    one["fell_back"] = c.fell_back;
    one["fallbacks"] = c.fallbacks;
    codecs[py::str(name)] = one;
  }
  d["engine_codecs"] = codecs;
  // all_reduce calls that skipped the ring (either latency path).
  d["small_message_ops"] = s.all_reduce_by_algorithm[static_cast<int>(rr::Algorithm::kSmall)] +
                           s.all_reduce_by_algorithm[static_cast<int>(rr::Algorithm::kDirect)];
  return d;
}

}  // namespace

void register_communicator(py::module_& m) {
  py::class_<rr::Options>(m, "Options", "A communicator's settings (see engine/options.h).")
      .def(py::init<>())
      .def_readwrite("timeout_seconds", &rr::Options::timeout_seconds)
      .def_readwrite("segment_bytes", &rr::Options::segment_bytes)
      .def_readwrite("small_bytes", &rr::Options::small_bytes)
      .def_property(
          "algorithm", [](const rr::Options& o) { return o.algorithm; },
          [](rr::Options& o, const std::string& name) {
            rr::parse_algorithm_policy(name);  // InvalidArgument (ValueError) for a bad name
            o.algorithm = name;
          })
      .def_readwrite("transport", &rr::Options::transport)
      .def_readwrite("host_id", &rr::Options::host_id)
      .def_readwrite("spin_us", &rr::Options::spin_us)
      .def_readwrite("shm_single_copy_bytes", &rr::Options::shm_single_copy_bytes)
      .def_readwrite("device_staging_bytes", &rr::Options::device_staging_bytes)
      .def_readwrite("device_land_in_place", &rr::Options::device_land_in_place)
      .def_readwrite("stream_store_bytes", &rr::Options::stream_store_bytes)
      .def_readwrite("shm_slot_bytes", &rr::Options::shm_slot_bytes)
      .def_readwrite("socket_addr", &rr::Options::socket_addr)
      .def_readwrite("token", &rr::Options::token)
      .def_readwrite("log_algorithm", &rr::Options::log_algorithm)
      .def_readwrite("tcp_streams", &rr::Options::tcp_streams)
      .def_readwrite("tcp_keepalive_seconds", &rr::Options::tcp_keepalive_seconds)
      .def_readwrite("fake_device", &rr::Options::fake_device)
      .def_readwrite("point_to_point", &rr::Options::point_to_point);

  py::class_<rr::Work, std::shared_ptr<rr::Work>>(m, "Work")
      .def("wait", &rr::Work::wait, py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
           "Waits at most `seconds` (negative: until the collective ends); True when finished.")
      .def("done", &rr::Work::done)
      .def_property_readonly("source", &rr::Work::source,
                             "A receive's sender, once it has arrived (else -1).")
      .def_property_readonly("description", &rr::Work::description);

  py::class_<rr::SharedWindow, std::shared_ptr<rr::SharedWindow>>(m, "Window",
                                                                  py::buffer_protocol(),
                                                                  "A window's bytes "
                                                                  "(Communicator.allocate_window).")
      .def_buffer([](rr::SharedWindow& w) {
        return py::buffer_info(w.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(w.bytes())}, {1});
      })
      .def_property_readonly("id", &rr::SharedWindow::id)
      .def_property_readonly("nbytes", &rr::SharedWindow::bytes);

  py::class_<rr::DeviceWindow, std::shared_ptr<rr::DeviceWindow>>(
      m, "DeviceWindow", "A device window's memory (Communicator.allocate_device_window).")
      .def_property_readonly(
          "ptr", [](const rr::DeviceWindow& w) { return reinterpret_cast<uintptr_t>(w.data()); },
          "The device address of its first byte.")
      .def_property_readonly("device", &rr::DeviceWindow::device)
      .def_property_readonly("id", &rr::DeviceWindow::id,
                             "The window's id on every rank; 0 for memory shared with nobody.")
      .def_property_readonly("nbytes", &rr::DeviceWindow::bytes)
      .def_property_readonly("shared", &rr::DeviceWindow::shared,
                             "False where some rank's GPU could not map another's (no peer "
                             "access): this rank's memory alone, which all_reduce stages.")
      .def_property_readonly("unshared_reason", &rr::DeviceWindow::unshared_reason);

  py::class_<rr::Communicator>(m, "Communicator")
      .def_static(
          "create_tcp",
          [](int rank, int world_size, const std::string& master_addr, int master_port,
             const std::string& store_dir, const rr::Options& options, py::object port_ready) {
            std::function<void(int)> listening;
            if (!port_ready.is_none()) {
              listening = [&port_ready](int port) {
                py::gil_scoped_acquire gil;
                port_ready(port);
              };
            }
            py::gil_scoped_release release;
            PythonInterrupt interrupt;  // Ctrl-C while waiting for the other ranks
            return rr::create_tcp_communicator(rank, world_size, master_addr, master_port,
                                               store_dir, options, &interrupt, listening);
          },
          py::arg("rank"), py::arg("world_size"), py::arg("master_addr"), py::arg("master_port"),
          py::arg("store_dir"), py::arg("options"), py::arg("port_ready") = py::none(),
          "A communicator meeting at rank 0's TCP store (or a file store in store_dir). "
          "Rank 0 may pass master_port=0: its store then listens on a port the kernel "
          "picks, and port_ready(port) is called with it before rank 0 waits for the others.")
      .def_static(
          "create_with_store",
          [](py::object store, int rank, int world_size, const std::string& advertise,
             const std::string& meeting, const rr::Options& options, rr::Communicator* parent,
             std::optional<std::vector<int>> old_ranks) {
            auto impl = std::make_unique<PythonStore>(std::move(store));
            py::gil_scoped_release release;
            PythonInterrupt interrupt;
            rr::LinkReuse reuse;
            if (old_ranks) {
              reuse.parent = parent != nullptr ? parent->revoked_transport() : nullptr;
              reuse.old_ranks = *old_ranks;
            }
            return rr::create_store_communicator(std::move(impl), rank, world_size, advertise,
                                                 meeting, options, &interrupt,
                                                 old_ranks ? &reuse : nullptr);
          },
          py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("advertise"),
          py::arg("meeting"), py::arg("options"), py::arg("parent") = nullptr,
          py::arg("old_ranks") = py::none(),
          "A communicator meeting through `store`, an object with set(key, value), "
          "try_get(key) and set_if_absent(key, value) (bytes values); optionally "
          "try_get_many(keys), set_many(items) and claim(key, value), where it can do "
          "better than one request each. A shrink passes "
          "`old_ranks` (each new rank's rank in the communicator it shrinks, on every rank) "
          "and `parent`, that communicator: the TCP ring takes over the links it parked "
          "between ranks that stay neighbours.")
      .def_property_readonly("rank", &rr::Communicator::rank)
      .def_property_readonly("world_size", &rr::Communicator::size)
      .def_property_readonly("local_rank", &rr::Communicator::local_rank)
      .def_property_readonly("local_world_size", &rr::Communicator::local_size)
      .def_property_readonly("transport", &rr::Communicator::transport_name)
      .def_property_readonly("timeout", &rr::Communicator::timeout)
      .def_property_readonly("fake_device", &rr::Communicator::fake_device,
                             "Whether device arrays run on the CPU emulation (tests).")
      .def("interrupt", &rr::Communicator::interrupt,
           "The caller stopped waiting (Ctrl-C): the running or next collective fails on the "
           "worker as interrupted, the peers are told, and the communicator is broken.")
      .def(
          "submit",
          [](rr::Communicator& self, rr::CollectiveKind kind, uintptr_t send, uintptr_t recv,
             size_t count, rr::DataType dtype, rr::ReduceOp op, int root, int device,
             uintptr_t stream, const Blocks& blocks, const CompressionArgs& compression) {
            rr::CollectiveArgs args =
                make_args(kind, send, recv, count, dtype, op, root, device, stream, blocks);
            add_compression(args, compression);
            return self.submit(args);
          },
          py::arg("kind"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("root"), py::arg("device") = -1, py::arg("stream") = 0,
          py::arg("blocks") = Blocks{}, py::arg("compression") = py::none(),
          "Queues a collective on raw addresses for the worker thread. device >= 0: they are "
          "memory of that CUDA device, and the collective starts after the work queued so far "
          "on `stream` (a cudaStream_t; 0 is the legacy default stream).")
      .def(
          "run",
          [](rr::Communicator& self, rr::CollectiveKind kind, uintptr_t send, uintptr_t recv,
             size_t count, rr::DataType dtype, rr::ReduceOp op, int root, int device,
             uintptr_t stream, const Blocks& blocks, const CompressionArgs& compression) {
            rr::CollectiveArgs args =
                make_args(kind, send, recv, count, dtype, op, root, device, stream, blocks);
            add_compression(args, compression);
            PythonInterrupt interrupt;
            py::gil_scoped_release release;
            self.run(args, &interrupt);
          },
          py::arg("kind"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("root"), py::arg("device") = -1, py::arg("stream") = 0,
          py::arg("blocks") = Blocks{}, py::arg("compression") = py::none(),
          "Runs a collective on raw addresses to completion: on this thread when nothing is "
          "queued. Ctrl-C abandons it (KeyboardInterrupt) and breaks the communicator.")
      .def(
          "wait",
          [](rr::Communicator& self, const std::shared_ptr<rr::Work>& work, double seconds) {
            PythonInterrupt interrupt;
            py::gil_scoped_release release;
            return self.wait(work, seconds, &interrupt);
          },
          py::arg("work"), py::arg("seconds"),
          "Waits at most `seconds` (negative: until it ends) for a Work of this "
          "communicator; True when it has finished. A collective the worker has not taken "
          "yet runs on this thread, after the ones queued before it.")
      .def(
          "send",
          [](rr::Communicator& self, uintptr_t data, size_t bytes, int dst, int64_t tag) {
            return self.send(as_ptr(data), bytes, dst, tag);
          },
          py::arg("data"), py::arg("bytes"), py::arg("dst"), py::arg("tag"),
          "Posts a point-to-point send of raw host memory; the Work finishes once it left.")
      .def(
          "recv",
          [](rr::Communicator& self, uintptr_t data, size_t bytes, int src, int64_t tag) {
            return self.recv(as_ptr(data), bytes, src, tag);
          },
          py::arg("data"), py::arg("bytes"), py::arg("src"), py::arg("tag"),
          "Posts a point-to-point receive into raw host memory; src < 0: from any rank.")
      .def("close", &rr::Communicator::close, py::call_guard<py::gil_scoped_release>())
      .def("release_links", &rr::Communicator::release_links,
           py::call_guard<py::gil_scoped_release>(),
           "After a shrink made the survivors' communicator from this revoked one: closes "
           "the links and memory it still holds (what the shrink did not take over).")
      .def("abort", &rr::Communicator::abort, py::call_guard<py::gil_scoped_release>(),
           "Stops this rank's work now, from any thread: queued and running collectives "
           "and point-to-point operations fail, the peers are told, and the communicator "
           "refuses later calls (close() still works).")
      .def("note_refused_call", &rr::Communicator::note_refused_call, py::arg("call"),
           py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
           "Records that this rank refused a call (bad arguments), so that peers failing "
           "on its account name the reason.")
      .def("set_issuer", &rr::Communicator::set_issuer, py::arg("tag"),
           "Tags the calls that follow with the issuing thread (see Communicator::set_issuer).")
      .def("stats", &stats)
      .def(
          "allocate_window",
          [](rr::Communicator& c, size_t bytes) {
            py::gil_scoped_release release;
            PythonInterrupt interrupt;
            return c.allocate_window(bytes, &interrupt);
          },
          py::arg("bytes"),
          "Collective: a Window of `bytes` that every rank maps, for all_reduce to read in "
          "place; None where the ranks do not all share this host.")
      .def(
          "allocate_device_window",
          [](rr::Communicator& c, size_t bytes, int device) {
            py::gil_scoped_release release;
            PythonInterrupt interrupt;
            return c.allocate_device_window(bytes, device, &interrupt);
          },
          py::arg("bytes"), py::arg("device"),
          "Collective: a DeviceWindow of `bytes` of CUDA device `device`, zeroed, that every "
          "rank of the host maps (CUDA IPC); this rank's alone where the ranks do not all "
          "share this host.")
      .def(
          "publish",
          [](rr::Communicator& c, const std::string& key, const py::bytes& value) {
            std::string v = value;
            py::gil_scoped_release release;
            c.publish(key, v);
          },
          py::arg("key"), py::arg("value"))
      .def(
          "try_fetch_many",
          [](rr::Communicator& c, const std::vector<std::string>& keys) {
            std::vector<std::optional<std::string>> got;
            {
              py::gil_scoped_release release;
              got = c.try_fetch_many(keys);
            }
            return bytes_or_none(got);
          },
          py::arg("keys"),
          "The published values of keys (None where not yet), read together: one round trip.")
      .def(
          "fetch",
          [](rr::Communicator& c, const std::string& key, double seconds) {
            std::string v;
            {
              py::gil_scoped_release release;
              v = c.fetch(key, seconds);
            }
            return py::bytes(v);
          },
          py::arg("key"), py::arg("seconds"))
      .def_property_readonly("id", &rr::Communicator::id)
      .def_property_readonly("failure", &rr::Communicator::failure);
}
