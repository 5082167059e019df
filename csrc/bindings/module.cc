// pybind11 module ringreduce._core: a thin, pointer-level layer. The Python
// package validates arrays and passes raw addresses; every wait here releases
// the GIL so other Python threads run while a collective is in flight. This
// file holds the module, its error translation, enums and testing hooks;
// communicator_bindings.cc the communicator.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <cstdlib>

#include "algorithms/collective.h"
#include "algorithms/ring_schedule.h"
#include "bindings/codes.h"
#include "common/error.h"
#include "common/fault_report.h"
#include "common/page_lock.h"
#include "common/process_state.h"
#include "config.h"
#include "engine/choice.h"
#include "engine/options.h"
#include "executor/device_window.h"
#include "executor/devices.h"
#include "kernels/codec.h"
#include "reduce/cpu_kernels.h"
#include "rendezvous/store.h"
#include "security/auth.h"
#include "testing/fuzz.h"
#include "testing/stalled_wait.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/tcp_transport.h"

namespace py = pybind11;

// CUDA helpers (cuda_bindings.cc); they report unavailability in a build
// without CUDA. `testing` receives the hooks only tests and benchmarks use.
void register_cuda(py::module_& m, py::module_& testing);
// Options, Communicator and Work (communicator_bindings.cc).
void register_communicator(py::module_& m);
void register_stores(py::module_& m);
// The codec kernels of compressed all-reduce (codec_bindings.cc).
void register_codecs(py::module_& m);
void register_device_codec(py::module_& m);
void register_fast_path(py::module_& m);

namespace {

// ringreduce.errors.<name>(message) with .peer set (None for -1).
py::object python_error(const char* name, const char* message, int peer) {
  py::object exc = py::module_::import("ringreduce.errors").attr(name)(message);
  exc.attr("peer") = peer >= 0 ? py::object(py::int_(peer)) : py::object(py::none());
  return exc;
}

void raise_error(const py::object& exc) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

void raise_python(const char* name, const char* message, int peer) {
  raise_error(python_error(name, message, peer));
}

// PeerError carries its reason ("unreachable"), None when nothing more is known.
void raise_peer(const rr::PeerError& e) {
  py::object exc = python_error("PeerError", e.what(), e.peer());
  if (!e.reason().empty()) exc.attr("reason") = py::str(e.reason());
  raise_error(exc);
}

// MismatchError carries both sides as attributes: reason, ranks, calls and
// issuers (see rr::MismatchFacts), None when the engine did not know them.
void raise_mismatch(const rr::MismatchError& e) {
  py::object exc = python_error("MismatchError", e.what(), e.peer());
  const rr::MismatchFacts& f = e.facts();
  if (f.known()) {
    exc.attr("reason") = py::str(f.reason);
    exc.attr("ranks") = py::make_tuple(f.ranks[0], f.ranks[1]);
    exc.attr("calls") = py::make_tuple(f.calls[0], f.calls[1]);
    exc.attr("issuers") = py::make_tuple(py::int_(f.issuers[0]), py::int_(f.issuers[1]));
  }
  raise_error(exc);
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const rr::Interrupted& e) {
    // The signal handler's exception (KeyboardInterrupt) is already set.
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
  } catch (const rr::MismatchError& e) {
    raise_mismatch(e);
  } catch (const rr::TimeoutError& e) {
    raise_python("TimeoutError", e.what(), e.peer());
  } catch (const rr::PeerError& e) {
    raise_peer(e);
  } catch (const rr::AuthenticationError& e) {
    raise_python("AuthenticationError", e.what(), -1);
  } catch (const rr::InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const rr::Error& e) {
    raise_python("RingReduceError", e.what(), -1);
  }
}

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// The engine's numbering of dtypes, ops and collectives, so that Python never
// keeps a copy of it.
void register_enums(py::module_& m) {
  py::enum_<rr::DataType>(m, "DType", "Element types the engine reduces.")
      .value("float16", rr::DataType::kFloat16)
      .value("bfloat16", rr::DataType::kBFloat16)
      .value("float32", rr::DataType::kFloat32)
      .value("float64", rr::DataType::kFloat64)
      .value("int8", rr::DataType::kInt8)
      .value("uint8", rr::DataType::kUInt8)
      .value("int32", rr::DataType::kInt32)
      .value("int64", rr::DataType::kInt64);
  py::enum_<rr::ReduceOp>(m, "Op", "Reduction operators.")
      .value("SUM", rr::ReduceOp::kSum)
      .value("PROD", rr::ReduceOp::kProd)
      .value("MIN", rr::ReduceOp::kMin)
      .value("MAX", rr::ReduceOp::kMax)
      .value("AVG", rr::ReduceOp::kAvg);
  py::enum_<rr::CollectiveKind>(m, "Collective", "The collectives a communicator runs.")
      .value("ALL_REDUCE", rr::CollectiveKind::kAllReduce)
      .value("REDUCE_SCATTER", rr::CollectiveKind::kReduceScatter)
      .value("ALL_GATHER", rr::CollectiveKind::kAllGather)
      .value("BROADCAST", rr::CollectiveKind::kBroadcast)
      .value("BARRIER", rr::CollectiveKind::kBarrier)
      .value("REDUCE", rr::CollectiveKind::kReduce)
      .value("GATHER", rr::CollectiveKind::kGather)
      .value("SCATTER", rr::CollectiveKind::kScatter)
      .value("ALL_TO_ALL", rr::CollectiveKind::kAllToAll)
      .value("COMPRESSED_ALL_REDUCE", rr::CollectiveKind::kCompressedAllReduce)
      .value("COMPRESSED_REDUCE_SCATTER", rr::CollectiveKind::kCompressedReduceScatter);
}

// Hooks into the engine's pure parts for tests and benchmarks, kept out of
// the package's API in the _core.testing submodule.
void register_testing(py::module_& t) {
  t.def("retired_device_windows", &rr::DeviceWindow::retired_for_testing,
        "Device windows of this process whose arrays are gone but whose memory a peer may "
        "still map (not yet freed), after freeing those no peer maps.");
  t.def(
      "fake_stream_write",
      [](uintptr_t stream, uintptr_t address, const py::bytes& data) {
        rr::fake_stream_write(stream, reinterpret_cast<void*>(address), std::string(data));
      },
      py::arg("stream"), py::arg("address"), py::arg("data"),
      "Queues a write of `data` at `address` on the fake device's emulation of the caller's "
      "stream `stream`: it runs only once a collective submitted on that stream after it "
      "waits for the stream, or fake_stream_sync(stream) (executor/devices.h).");
  t.def("fake_stream_sync", &rr::fake_stream_sync, py::arg("stream"),
        "Runs everything queued on the fake device's emulated stream `stream`.");
  t.def("page_locked_ranges", &rr::page_lock::count,
        "Ranges of this process's host memory a device has page-locked (common/page_lock.h): "
        "each goes before its mapping does.");
  t.def(
      "stalled_wait",
      [](int awaited, int busy, double busy_seconds, double timeout) {
        rr::testing::StalledWait w;
        {
          py::gil_scoped_release release;
          w = rr::testing::stalled_wait(awaited, busy, busy_seconds, timeout);
        }
        return py::make_tuple(w.seconds, w.kind, w.peer, w.message);
      },
      py::arg("awaited"), py::arg("busy"), py::arg("busy_seconds"), py::arg("timeout"),
      "A routed wait on `awaited` (of 4 ranks; parts 'near': rank 1, 'far': 2 and 3) "
      "that never completes while `busy` moves messages for busy_seconds: (seconds, "
      "kind, blamed peer, message).");
  t.def(
      "reduce_scatter_step",
      [](int rank, int size, int step) {
        auto s = rr::reduce_scatter_step(rank, size, step);
        return std::make_pair(s.send_chunk, s.recv_chunk);
      },
      py::arg("rank"), py::arg("size"), py::arg("step"));
  t.def(
      "all_gather_step",
      [](int rank, int size, int step) {
        auto s = rr::all_gather_step(rank, size, step);
        return std::make_pair(s.send_chunk, s.recv_chunk);
      },
      py::arg("rank"), py::arg("size"), py::arg("step"));
  t.def("round_count", &rr::round_count, py::arg("count"), py::arg("parts"),
        py::arg("piece_elems"));
  t.def("piece_bounds", &rr::piece_bounds, py::arg("count"), py::arg("parts"), py::arg("index"),
        py::arg("round"), py::arg("piece_elems"));
  t.def(
      "reduce_local",
      [](int dtype, int op, uintptr_t out, uintptr_t a, uintptr_t b, size_t n) {
        rr::cpu_reduce_fn(rr::dtype_from_code(dtype), rr::op_from_code(op))(as_ptr(out), as_ptr(a),
                                                                            as_ptr(b), n);
      },
      py::arg("dtype"), py::arg("op"), py::arg("out"), py::arg("a"), py::arg("b"), py::arg("n"),
      "out = a op b on raw buffers with the CPU kernels.");
  t.def(
      "reduce_all_local",
      [](int dtype, int op, const std::vector<uintptr_t>& inputs, uintptr_t out, size_t n,
         int divisor) {
        if (inputs.empty()) throw rr::InvalidArgument("reduce_all_local: no inputs");
        std::vector<const void*> in;
        for (uintptr_t a : inputs) in.push_back(as_ptr(a));
        rr::reduce_all(rr::dtype_from_code(dtype), rr::op_from_code(op), in.data(), in.size(),
                       as_ptr(out), n, divisor);
      },
      py::arg("dtype"), py::arg("op"), py::arg("inputs"), py::arg("out"), py::arg("n"),
      py::arg("divisor") = 0,
      "out = inputs[0] op ... op inputs[-1] on raw buffers, accumulated in the compute type "
      "and rounded once (then / divisor when > 0): the window paths' arithmetic.");
  t.def(
      "divide_local",
      [](int dtype, uintptr_t data, size_t n, int divisor) {
        rr::divide_by(rr::dtype_from_code(dtype), as_ptr(data), n, divisor);
      },
      py::arg("dtype"), py::arg("data"), py::arg("n"), py::arg("divisor"),
      "data /= divisor on a raw buffer with the CPU kernels.");
  t.def(
      "sum_divide_local",
      [](int dtype, uintptr_t out, uintptr_t a, uintptr_t b, size_t n, int divisor) {
        return rr::sum_divide(rr::dtype_from_code(dtype), as_ptr(out), as_ptr(a), as_ptr(b), n,
                              divisor);
      },
      py::arg("dtype"), py::arg("out"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("divisor"),
      "out = (a + b) / divisor in one pass (avg's last reduce-scatter step); False, and "
      "nothing written, for a dtype without that kernel.");
  t.def(
      "shm_reserve",
      [](size_t bytes, size_t offset, size_t len, bool populate) {
        // A segment made and attached in this process, as a peer would attach it,
        // connected; the attached one then reserves [offset, offset + len): through
        // its mapping, or (populate=False, as on kernels before 5.14) through the fd
        // it keeps. (whether it kept the fd, bytes the memfd holds before, after).
        rr::shm::set_populate_for_testing(populate);
        struct Restore {
          ~Restore() { rr::shm::set_populate_for_testing(true); }
        } restore;
        auto owner = rr::shm::Segment::create(bytes);
        auto peer = rr::shm::Segment::attach(owner.record(), bytes, 0);
        const auto held = [&] {
          struct stat st{};
          const std::string path = "/proc/self/fd/" + std::to_string(owner.record().fd);
          if (::stat(path.c_str(), &st) != 0) throw rr::Error("shm_reserve: cannot stat");
          return static_cast<uint64_t>(st.st_blocks) * 512;
        };
        const bool kept = peer.keep_fd_only_if_needed();
        const uint64_t before = held();
        peer.reserve(offset, len, "in a test segment");
        return std::make_tuple(kept, before, held());
      },
      py::arg("bytes"), py::arg("offset"), py::arg("len"), py::arg("populate"));
  t.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        const rr::Digest d = rr::hmac_sha256(std::string(key), std::string(message));
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      py::arg("key"), py::arg("message"), "HMAC-SHA256 as the engine computes it.");
  t.def(
      "sha256",
      [](const py::bytes& data) {
        const rr::Digest d = rr::sha256(std::string(data));
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      py::arg("data"), "SHA-256 as the engine computes it.");
  t.def(
      "fuzz_parsers",
      [](uint64_t frames, uint64_t seed) {
        std::map<std::string, rr::FuzzCounts> counts;
        {
          py::gil_scoped_release nogil;
          counts = rr::fuzz_parsers(frames, seed);
        }
        py::dict out;
        for (const auto& [name, c] : counts) {
          py::dict d;
          d["frames"] = c.frames;
          d["accepted"] = c.accepted;
          d["rejected"] = c.rejected;
          d["incomplete"] = c.incomplete;
          d["violations"] = c.violations;
          d["first_violation"] = c.first_violation;
          out[py::str(name)] = d;
        }
        return out;
      },
      py::arg("frames"), py::arg("seed"),
      "Feeds `frames` random and mutated inputs to each wire parser; per parser the counts "
      "of accepted, rejected and incomplete inputs and of contract violations.");
}

using rr::small_message_bytes;  // the engine's rule (algorithms/collective.h)

// A transport of `size` ranks that carries nothing: all the choice of
// algorithm asks of its transport is the number of ranks.
class ShapeOnlyTransport final : public rr::Transport {
 public:
  ShapeOnlyTransport(int size, bool reaches_all) : size_(size), reaches_all_(reaches_all) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const char* name() const override { return "shape only"; }
  rr::RequestPtr isend(int, const void*, size_t) override { refuse(); }
  rr::RequestPtr irecv(int, void*, size_t) override { refuse(); }
  rr::RequestPtr irecv_view(int, size_t) override { refuse(); }
  void release(rr::Request&) override { refuse(); }
  void wait(rr::Request&, const rr::Deadline&) override { refuse(); }
  bool progress() override { return false; }
  bool wait_for(rr::Request&, std::chrono::microseconds) override { refuse(); }
  bool reaches(int peer) const override {
    return peer > 0 && peer < size_ && (reaches_all_ || peer == 1 || peer == size_ - 1);
  }
  void abort() noexcept override {}
  rr::TransportStats stats() const override { return {}; }

 private:
  [[noreturn]] static void refuse() { throw rr::Error("a shape-only transport carries nothing"); }
  int size_;
  bool reaches_all_;
};

// The algorithm the engine runs `kind` with on `nbytes` per rank, for rank 0
// of `world_size` ranks on hosts of `ranks_per_host` consecutive ranks (the
// last host smaller when they do not divide), over a transport that reaches
// every peer directly or only the ring neighbours: the engine's choose()
// itself, with the context a communicator gives it. `explain`: explain()'s
// sentence instead of the name.
std::string engine_choice(rr::CollectiveKind kind, size_t nbytes, int world_size,
                          int ranks_per_host, bool reaches_all, const rr::Options& options,
                          bool explain) {
  if (world_size < 1) throw rr::InvalidArgument("world_size must be >= 1");
  if (ranks_per_host < 1 || ranks_per_host > world_size) {
    throw rr::InvalidArgument("ranks_per_host must be in 1..world_size");
  }
  std::vector<std::string> host_of(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    host_of[static_cast<size_t>(r)] = std::to_string(r / ranks_per_host);
  }
  const rr::Hierarchy hierarchy = rr::make_hierarchy(host_of, 0);
  ShapeOnlyTransport transport(world_size, reaches_all);
  std::vector<char> scratch;
  rr::RingContext ctx{transport,
                      options.timeout_seconds,
                      options.segment_bytes,
                      1,
                      scratch,
                      small_message_bytes(options.small_bytes, world_size)};
  ctx.reaches_all = reaches_all;
  ctx.hierarchy = &hierarchy;
  ctx.policy = rr::parse_algorithm_policy(options.algorithm);
  rr::CollectiveArgs args;
  args.kind = kind;
  args.dtype = rr::DataType::kUInt8;  // so that count is the byte count
  args.count = nbytes;
  const rr::Choice choice = rr::choose(ctx, args);
  return explain ? rr::explain(choice, ctx, args) : rr::algorithm_name(choice.algorithm);
}

// The engine's rules, as pure functions of a job's shape and settings, for
// the cost model (ringreduce.model) to follow instead of copying them.
void register_rules(py::module_& m) {
  m.def("install_fault_report", &rr::install_fault_report,
        "Reports a SIGBUS/SIGSEGV's code, address and mapping on stderr before the previous "
        "handler runs (RINGREDUCE_DEBUG=faults; ringreduce._env installs it). True if "
        "installed.");
  m.def("small_message_bytes", &small_message_bytes, py::arg("small_bytes"), py::arg("world_size"),
        "all_reduce up to this many bytes takes a latency path at world_size ranks: "
        "small_bytes x 2 / world_size (0 at one rank).");
  m.def(
      "engine_algorithm",
      [](rr::CollectiveKind kind, size_t nbytes, int world_size, int ranks_per_host,
         bool reaches_all, const rr::Options& options) {
        return engine_choice(kind, nbytes, world_size, ranks_per_host, reaches_all, options, false);
      },
      py::arg("kind"), py::arg("nbytes"), py::arg("world_size"), py::arg("ranks_per_host"),
      py::arg("reaches_all"), py::arg("options"),
      "The algorithm (\"ring\", \"small\", \"direct\" or \"hierarchical\") the engine runs "
      "`kind` with on `nbytes` per rank: world_size ranks on hosts of ranks_per_host "
      "consecutive ranks, over a transport that reaches every peer directly (reaches_all) "
      "or only the ring neighbours, with options.small_bytes and options.algorithm.");
  m.def(
      "explain_engine_algorithm",
      [](rr::CollectiveKind kind, size_t nbytes, int world_size, int ranks_per_host,
         bool reaches_all, const rr::Options& options) {
        return engine_choice(kind, nbytes, world_size, ranks_per_host, reaches_all, options, true);
      },
      py::arg("kind"), py::arg("nbytes"), py::arg("world_size"), py::arg("ranks_per_host"),
      py::arg("reaches_all"), py::arg("options"),
      "Why the engine picks engine_algorithm(...)'s algorithm: the sentence "
      "RINGREDUCE_DEBUG=algorithm logs.");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringreduce C++ engine (internal; use the ringreduce package)";
  py::register_exception_translator(&translate);
  // Debug builds report faults always; others when RINGREDUCE_DEBUG names
  // "faults", which ringreduce._env reads (install_fault_report below).
  rr::install_fault_report_if_requested(nullptr);

  register_enums(m);
  register_stores(m);
  register_communicator(m);
  register_fast_path(m);
  register_rules(m);
  register_codecs(m);
  register_device_codec(m);

  // How often (ms) a rendezvous wait for a rank's key asks whether it is gone,
  // unless its store says otherwise (Store::peer_look): the meeting store's
  // default for large meetings (ringreduce._comm.membership.meeting).
  m.attr("PEER_LOOK_MS") = static_cast<int>(rr::kPeerLook.count());
  m.def("chunk_bounds", &rr::chunk_bounds, py::arg("count"), py::arg("parts"), py::arg("index"));
  m.def(
      "this_process",
      []() -> py::object {
        const rr::ProcessName p = rr::this_process();
        if (!p.known()) return py::none();
        static const char* digits = "0123456789abcdef";
        std::string machine;
        for (uint8_t b : p.machine) machine += {digits[b >> 4], digits[b & 15]};
        return py::make_tuple(p.pid, p.start, machine);
      },
      "(pid, start time, machine) of this process, as other processes on its machine look "
      "it up with process_halted; None where /proc cannot be read.");
  m.def(
      "process_halted",
      [](uint32_t pid, uint64_t start, const std::string& machine) {
        rr::ProcessName p;
        p.pid = pid;
        p.start = start;
        if (machine.size() != 2 * p.machine.size()) return false;  // not a machine of ours
        for (size_t i = 0; i < p.machine.size(); ++i) {
          const std::string byte = machine.substr(2 * i, 2);
          char* end = nullptr;
          const unsigned long v = std::strtoul(byte.c_str(), &end, 16);
          if (end != byte.c_str() + 2) return false;
          p.machine[i] = static_cast<uint8_t>(v);
        }
        return rr::process_halted(p);
      },
      py::arg("pid"), py::arg("start"), py::arg("machine"),
      "True when the process this_process() described is on this machine and stopped "
      "(SIGSTOP, a debugger) or gone (its pid free, or another process's); False when it "
      "runs, or is on another machine.");
  m.def("local_ip_towards", &rr::local_ip_towards, py::arg("host"),
        "The address of the local interface that routes to `host` (nothing is sent).");
  m.def("build_info", [] {
    py::dict d;
    d["version"] = RR_VERSION;
    d["mpi"] = RR_WITH_MPI != 0;
    d["cuda"] = RR_WITH_CUDA != 0;
    py::list transports;
    transports.append("tcp");
    transports.append("shm");
    if (RR_WITH_MPI) transports.append("mpi");
    d["transports"] = transports;
    d["cpu_kernels"] = rr::cpu_kernel_isa();
    d["codec_kernels"] = rr::codec::codec_kernel_isa();
    return d;
  });
  py::module_ testing =
      m.def_submodule("testing", "Hooks into the engine for tests and benchmarks (not an API).");
  register_testing(testing);
  register_cuda(m, testing);
}
