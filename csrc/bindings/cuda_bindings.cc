// The CUDA part of ringreduce._core: device discovery, and (in _core.testing)
// pointer-level hooks for tests and bench/gpu_check.py (run one kernel and wait
// for it, raw device memory, event timing of the reduce kernel against a
// device-to-device copy).
//
// Compiled in every build; without CUDA the same names exist, report no
// device, and raise RingReduceError when called, so Python code never needs to
// know how the extension was built.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "bindings/codes.h"
#include "common/dtype.h"
#include "common/error.h"
#include "config.h"

#if RR_WITH_CUDA
#include "reduce/cuda_kernels.h"
#include "testing/flag_probe.h"
#endif

namespace py = pybind11;

#if RR_WITH_CUDA

namespace {

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw rr::Error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

void require_device() {
  if (rr::cuda_device_count() == 0)
    throw rr::Error("no CUDA device is usable (no GPU or no driver)");
}

// Makes the device that owns the buffers current for this thread. This is the
// current device of ringreduce's own static runtime: torch's or cupy's choice
// of current device does not carry over.
void use_device_of(std::initializer_list<uintptr_t> addresses) {
  require_device();
  int device = -1;
  for (uintptr_t address : addresses) {
    int owner = -1;
    if (rr::cuda_pointer_device(reinterpret_cast<const void*>(address), &owner) != cudaSuccess) {
      cudaGetLastError();
      throw rr::InvalidArgument("address " + std::to_string(address) +
                                " is not CUDA device memory");
    }
    if (device >= 0 && owner != device) {
      throw rr::InvalidArgument("buffers are on different devices (" + std::to_string(device) +
                                " and " + std::to_string(owner) + ")");
    }
    device = owner;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
}

// Waits for the launch with the GIL released, and turns a fault inside the
// kernel into an exception.
void finish(cudaError_t launched, cudaStream_t stream) {
  check(launched, "kernel launch");
  cudaError_t err;
  {
    py::gil_scoped_release release;
    err = cudaStreamSynchronize(stream);
  }
  check(err, "cudaStreamSynchronize");
}

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

void reduce_sync(int dtype, int op, uintptr_t out, uintptr_t a, uintptr_t b, size_t n,
                 uintptr_t stream) {
  const rr::DataType t = rr::dtype_from_code(dtype);
  const rr::ReduceOp o = rr::op_from_code(op);
  if (n == 0) return;
  use_device_of({out, a, b});
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  finish(rr::cuda_reduce(t, o, as_ptr(out), as_ptr(a), as_ptr(b), n, s), s);
}

void reduce_all_sync(int dtype, int op, const std::vector<uintptr_t>& inputs,
                     const std::vector<uintptr_t>& outputs, size_t n, int divisor) {
  const rr::DataType t = rr::dtype_from_code(dtype);
  const rr::ReduceOp o = rr::op_from_code(op);
  if (inputs.empty()) throw rr::InvalidArgument("cuda_reduce_all: no inputs");
  if (n == 0) return;
  use_device_of({inputs[0]});
  std::vector<const void*> in;
  std::vector<void*> out;
  for (uintptr_t a : inputs) in.push_back(as_ptr(a));
  for (uintptr_t a : outputs) out.push_back(as_ptr(a));
  finish(rr::cuda_reduce_all(t, o, in.data(), static_cast<int>(in.size()), out.data(),
                             static_cast<int>(out.size()), n, divisor, nullptr),
         nullptr);
}

void divide_sync(int dtype, uintptr_t data, size_t n, int divisor, uintptr_t stream) {
  const rr::DataType t = rr::dtype_from_code(dtype);
  if (!rr::is_floating(t)) throw rr::InvalidArgument("division needs a floating dtype");
  if (n == 0) return;
  use_device_of({data});
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  finish(rr::cuda_divide(t, as_ptr(data), n, divisor, s), s);
}

py::dict device_properties(int device) {
  require_device();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  py::dict d;
  d["name"] = std::string(prop.name);
  d["compute_capability"] = py::make_tuple(prop.major, prop.minor);
  d["multiprocessors"] = prop.multiProcessorCount;
  d["total_memory"] = prop.totalGlobalMem;
  return d;
}

// Raw device memory, so tests and bench/gpu_check.py need neither torch nor cupy.
uintptr_t malloc_device(size_t nbytes, int device) {
  require_device();
  check(cudaSetDevice(device), "cudaSetDevice");
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, nbytes), "cudaMalloc");
  return reinterpret_cast<uintptr_t>(ptr);
}

void free_device(uintptr_t ptr) { check(cudaFree(as_ptr(ptr)), "cudaFree"); }

// The device that owns a CUDA pointer, for arrays that do not say (numba's).
int pointer_device(uintptr_t ptr) {
  require_device();
  int device = -1;
  if (rr::cuda_pointer_device(as_ptr(ptr), &device) != cudaSuccess) {
    cudaGetLastError();
    throw rr::InvalidArgument("address " + std::to_string(ptr) + " is not CUDA device memory");
  }
  return device;
}

// Either side may be host or device memory: unified addressing tells them apart.
void memcpy_any(uintptr_t dst, uintptr_t src, size_t nbytes) {
  cudaError_t err;
  {
    py::gil_scoped_release release;
    err = cudaMemcpy(as_ptr(dst), as_ptr(src), nbytes, cudaMemcpyDefault);
  }
  check(err, "cudaMemcpy");
}

// A private stream and two events, released on every way out.
class StreamTimer {
 public:
  StreamTimer() = default;
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  ~StreamTimer() {
    if (stop_) cudaEventDestroy(stop_);
    if (start_) cudaEventDestroy(start_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Seconds per call of launch(stream), averaged over `iters` back-to-back
  // calls after one untimed warm-up call (which also loads the kernel).
  template <typename Launch>
  double seconds_per_call(Launch launch, int iters) {
    if (iters < 1) throw rr::InvalidArgument("iters must be at least 1");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    check(launch(stream_), "warm-up launch");
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) check(launch(stream_), "launch");
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    cudaError_t err;
    {
      py::gil_scoped_release release;
      err = cudaEventSynchronize(stop_);
    }
    check(err, "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3 / iters;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

double time_reduce(int dtype, int op, uintptr_t out, uintptr_t a, uintptr_t b, size_t n,
                   int iters) {
  const rr::DataType t = rr::dtype_from_code(dtype);
  const rr::ReduceOp o = rr::op_from_code(op);
  use_device_of({out, a, b});
  return StreamTimer().seconds_per_call(
      [&](cudaStream_t s) {
        return rr::cuda_reduce(t, o, as_ptr(out), as_ptr(a), as_ptr(b), n, s);
      },
      iters);
}

double time_copy(uintptr_t dst, uintptr_t src, size_t nbytes, int iters) {
  use_device_of({dst, src});
  return StreamTimer().seconds_per_call(
      [&](cudaStream_t s) {
        return cudaMemcpyAsync(as_ptr(dst), as_ptr(src), nbytes, cudaMemcpyDeviceToDevice, s);
      },
      iters);
}

py::dict flag_probe(const std::string& mode, uintptr_t page, size_t page_bytes, int rank,
                    uint64_t first, int iters, double timeout_s, int device) {
  require_device();
  rr::testing::FlagProbe r;
  {
    py::gil_scoped_release release;
    r = rr::testing::flag_probe(mode, reinterpret_cast<uint64_t*>(page), page_bytes, rank, first,
                                iters, timeout_s, device);
  }
  py::dict d;
  d["seconds"] = r.seconds;
  d["completed"] = r.completed;
  d["timed_out"] = r.timed_out;
  return d;
}

}  // namespace

void register_cuda(py::module_& m, py::module_& t) {
  m.def("cuda_device_count", &rr::cuda_device_count,
        "Number of usable CUDA devices; 0 without a GPU, a driver or a CUDA build.");
  m.def("cuda_device_properties", &device_properties, py::arg("device") = 0,
        "name, compute_capability, multiprocessors and total_memory of a device.");
  m.def("cuda_pointer_device", &pointer_device, py::arg("ptr"),
        "The CUDA device that owns a device pointer; ValueError for host memory.");
  t.def("cuda_reduce", &reduce_sync, py::arg("dtype"), py::arg("op"), py::arg("out"), py::arg("a"),
        py::arg("b"), py::arg("n"), py::arg("stream") = 0,
        "out = a op b on CUDA device pointers with the CUDA kernels, on `stream` (0: the legacy "
        "default stream) of the device that owns them; returns once the kernel has finished.");
  t.def("cuda_reduce_all", &reduce_all_sync, py::arg("dtype"), py::arg("op"), py::arg("inputs"),
        py::arg("outputs"), py::arg("n"), py::arg("divisor") = 0,
        "Every output = inputs[0] op ... op inputs[-1] on CUDA device pointers, in one kernel "
        "with reduce_all_local()'s arithmetic; returns once it has finished.");
  t.def("cuda_divide", &divide_sync, py::arg("dtype"), py::arg("data"), py::arg("n"),
        py::arg("divisor"), py::arg("stream") = 0,
        "data /= divisor on a CUDA device pointer; returns once the kernel has finished.");
  t.def("cuda_malloc", &malloc_device, py::arg("nbytes"), py::arg("device") = 0,
        "cudaMalloc on `device`; returns the address.");
  t.def("cuda_free", &free_device, py::arg("ptr"));
  t.def("cuda_memcpy", &memcpy_any, py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        "Blocking copy between any two host or device addresses.");
  t.def("cuda_time_reduce", &time_reduce, py::arg("dtype"), py::arg("op"), py::arg("out"),
        py::arg("a"), py::arg("b"), py::arg("n"), py::arg("iters"),
        "Seconds per cuda_reduce() call, timed with CUDA events on a private stream.");
  t.def("cuda_time_copy", &time_copy, py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        py::arg("iters"),
        "Seconds per device-to-device cudaMemcpyAsync, timed like cuda_time_reduce.");
  t.def("cuda_flag_probe", &flag_probe, py::arg("mode"), py::arg("page"), py::arg("page_bytes"),
        py::arg("rank"), py::arg("first"), py::arg("iters"), py::arg("timeout_s"),
        py::arg("device") = 0,
        "Rank `rank` of two processes passing `iters` barriers through 64-bit flags in the "
        "shared host page at `page` (testing/flag_probe.h): mode 'host', 'memops' or 'spin'. "
        "Returns seconds, completed and timed_out (bench/gpu_flag_probe.py).");
}

#else  // RR_WITH_CUDA

// Same names as the CUDA build, so callers need not know how _core was built.
void register_cuda(py::module_& m, py::module_& t) {
  m.def(
      "cuda_device_count", [] { return 0; },
      "Number of usable CUDA devices; 0 without a GPU, a driver or a CUDA build.");
  const auto unavailable = [](const py::args&, const py::kwargs&) {
    throw rr::Error("ringreduce was built without CUDA");
  };
  for (const char* name : {"cuda_device_properties", "cuda_pointer_device"}) {
    m.def(name, unavailable);
  }
  for (const char* name :
       {"cuda_reduce", "cuda_reduce_all", "cuda_divide", "cuda_malloc", "cuda_free", "cuda_memcpy",
        "cuda_time_reduce", "cuda_time_copy", "cuda_flag_probe"}) {
    t.def(name, unavailable);
  }
}

#endif  // RR_WITH_CUDA
