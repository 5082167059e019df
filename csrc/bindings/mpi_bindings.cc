// pybind11 module ringreduce._core_mpi: the MPI transport's entry points.
//
// It is a separate extension from _core so that _core never links libmpi:
// ringreduce imports and runs over TCP on machines without MPI, and only this
// module fails to import there. The communicators it creates are _core's
// Communicator type (pybind11 shares registered types between modules), and
// _core's exception translator turns engine errors into ringreduce.errors.
#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "engine/mpi_communicator.h"

namespace py = pybind11;

namespace {

// The communicator whose handle is stored at `address` (mpi4py's
// MPI._addressof(comm)), or MPI_COMM_WORLD for 0. Reading the handle from
// memory works for every MPI ABI: Open MPI's handles are pointers, MPICH's ints.
MPI_Comm comm_at(uintptr_t address) {
  if (address == 0) return MPI_COMM_WORLD;
  return *reinterpret_cast<const MPI_Comm*>(address);
}

bool is_initialized() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

void register_mpi(py::module_& m) {
  m.def(
      "create",
      [](uintptr_t comm_address, const rr::Options& options) {
        return rr::create_mpi_communicator(comm_at(comm_address), options);
      },
      py::arg("comm_address"), py::arg("options"), py::call_guard<py::gil_scoped_release>(),
      "A _core.Communicator over the MPI communicator stored at comm_address "
      "(0: MPI_COMM_WORLD). Collective over that communicator. options.transport: 'mpi' or "
      "'auto' (shared memory between ranks of one host).");
  m.def(
      "initialize",
      [] {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (initialized) return false;
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
        return true;
      },
      "Initializes MPI with MPI_THREAD_MULTIPLE unless it is initialized; True if it did.");
  m.def(
      "finalize",
      [] {
        if (is_initialized()) MPI_Finalize();
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", &is_initialized, "True between MPI_Init and MPI_Finalize.");
  m.def("thread_level", [] {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level;
  });
  m.def("world_rank_size", [] {
    int rank = 0;
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return py::make_tuple(rank, size);
  });
  m.def(
      "library_version",
      [] {
        char text[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(text, &len);
        return std::string(text, static_cast<size_t>(len));
      },
      "The MPI library this process runs (MPI_Get_library_version).");
  m.attr("THREAD_SERIALIZED") = static_cast<int>(MPI_THREAD_SERIALIZED);
  m.attr("THREAD_MULTIPLE") = static_cast<int>(MPI_THREAD_MULTIPLE);
}

PYBIND11_MODULE(_core_mpi, m) {
  m.doc() = "ringreduce MPI transport (internal; use ringreduce.init or Communicator.from_mpi)";
  // Registers the Communicator type and the exception translator we rely on.
  py::module_::import("ringreduce._core");
  register_mpi(m);
}
