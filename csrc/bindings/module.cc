// pybind11 module ringreduce._core: a thin, pointer-level layer. The Python
// package validates arrays and passes raw addresses; every wait here releases
// the GIL so other Python threads run while a collective is in flight.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "algorithms/ring_schedule.h"
#include "bindings/codes.h"
#include "common/error.h"
#include "config.h"
#include "engine/communicator.h"
#include "reduce/cpu_kernels.h"

namespace py = pybind11;

// CUDA helpers (cuda_bindings.cc); they report unavailability in a build
// without CUDA. `testing` receives the hooks only tests and benchmarks use.
void register_cuda(py::module_& m, py::module_& testing);

namespace {

// Raises ringreduce.errors.<name>(message) with .peer set.
void raise_python(const char* name, const char* message, int peer) {
  py::object cls = py::module_::import("ringreduce.errors").attr(name);
  py::object exc = cls(message);
  exc.attr("peer") = peer >= 0 ? py::object(py::int_(peer)) : py::object(py::none());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const rr::MismatchError& e) {
    raise_python("MismatchError", e.what(), e.peer());
  } catch (const rr::TimeoutError& e) {
    raise_python("TimeoutError", e.what(), e.peer());
  } catch (const rr::PeerError& e) {
    raise_python("PeerError", e.what(), e.peer());
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
      .value("BARRIER", rr::CollectiveKind::kBarrier);
}

// Hooks into the engine's pure parts for tests and benchmarks, kept out of
// the package's API in the _core.testing submodule.
void register_testing(py::module_& t) {
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
      "divide_local",
      [](int dtype, uintptr_t data, size_t n, int divisor) {
        rr::divide_by(rr::dtype_from_code(dtype), as_ptr(data), n, divisor);
      },
      py::arg("dtype"), py::arg("data"), py::arg("n"), py::arg("divisor"),
      "data /= divisor on a raw buffer with the CPU kernels.");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringreduce C++ engine (internal; use the ringreduce package)";
  py::register_exception_translator(&translate);

  py::class_<rr::Work, std::shared_ptr<rr::Work>>(m, "Work")
      .def("wait", &rr::Work::wait, py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
           "Waits at most `seconds` (negative: until the collective ends); True when finished.")
      .def("done", &rr::Work::done)
      .def_property_readonly("description", &rr::Work::description);

  register_enums(m);

  py::class_<rr::Communicator>(m, "Communicator")
      .def_static("create_tcp", &rr::create_tcp_communicator, py::arg("rank"),
                  py::arg("world_size"), py::arg("master_addr"), py::arg("master_port"),
                  py::arg("timeout"), py::arg("segment_bytes"), py::arg("store_dir"),
                  py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &rr::Communicator::rank)
      .def_property_readonly("world_size", &rr::Communicator::size)
      .def_property_readonly("transport", &rr::Communicator::transport_name)
      .def_property_readonly("timeout", &rr::Communicator::timeout)
      .def(
          "submit",
          [](rr::Communicator& self, rr::CollectiveKind kind, uintptr_t send, uintptr_t recv,
             size_t count, rr::DataType dtype, rr::ReduceOp op, int root, int device,
             uintptr_t stream) {
            rr::CollectiveArgs args;
            args.kind = kind;
            args.send = as_ptr(send);
            args.recv = as_ptr(recv);
            args.count = count;
            args.dtype = dtype;
            args.op = op;
            args.root = root;
            args.device = device;
            args.stream = stream;
            return self.submit(args);
          },
          py::arg("kind"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("root"), py::arg("device") = -1, py::arg("stream") = 0,
          "Queues a collective on raw addresses. device >= 0: they are memory of that CUDA "
          "device, and the collective starts after the work queued so far on `stream` (a "
          "cudaStream_t; 0 is the legacy default stream).")
      .def("close", &rr::Communicator::close, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const rr::Communicator& self) {
        rr::CommStats s = self.stats();
        py::dict d;
        d["bytes_sent"] = s.bytes_sent;
        d["bytes_received"] = s.bytes_received;
        d["ops"] = s.ops;
        d["small_message_ops"] = s.small_message_ops;
        return d;
      });

  m.def("chunk_bounds", &rr::chunk_bounds, py::arg("count"), py::arg("parts"), py::arg("index"));
  m.def("build_info", [] {
    py::dict d;
    d["version"] = RR_VERSION;
    d["mpi"] = RR_WITH_MPI != 0;
    d["cuda"] = RR_WITH_CUDA != 0;
    py::list transports;
    transports.append("tcp");
    if (RR_WITH_MPI) transports.append("mpi");
    d["transports"] = transports;
    d["cpu_kernels"] = rr::cpu_kernel_isa();
    return d;
  });
  py::module_ testing =
      m.def_submodule("testing", "Hooks into the engine for tests and benchmarks (not an API).");
  register_testing(testing);
  register_cuda(m, testing);
}
