// ringreduce._core.DeviceCodec: the codec kernels on device arrays, for the
// compressed collectives' device route (python/ringreduce/_comm/compressed/device.py).
//
// It holds a Device of its own (executor/device.h: CUDA streams, or the CPU
// emulation where the communicator's options say fake_device), never the one
// the communicator's collectives run on, so a compressed call on one thread and
// a device collective on the engine's worker never share lanes or staging.
// Addresses are plain integers: the device arrays' pointers (their owners keep
// them alive) and scratch this object allocates per role and keeps. Payloads
// travel through host numpy arrays, the rows the exchanges send: the codec
// writes them on the device, then one copy brings them over.
//
// Every method queues its work and waits for it (GIL released, Ctrl-C
// checked, within the timeout the object was made with), so when it returns the
// outputs are final and the caller's later stream work sees them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings/array_args.h"
#include "bindings/codes.h"
#include "bindings/python_interrupt.h"
#include "common/deadline.h"
#include "common/error.h"
#include "executor/devices.h"
#include "kernels/codec.h"

namespace py = pybind11;

namespace {

constexpr size_t kAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

template <typename T = void>
T* at(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

class DeviceCodec {
 public:
  DeviceCodec(int device, bool fake, double timeout_seconds)
      : device_(fake ? rr::make_fake_device(device) : rr::make_device(device)),
        timeout_(timeout_seconds) {}

  ~DeviceCodec() {
    for (auto& [role, kept] : kept_) {
      try {
        device_->release(kept.first);
      } catch (...) {
      }
    }
  }

  DeviceCodec(const DeviceCodec&) = delete;
  DeviceCodec& operator=(const DeviceCodec&) = delete;

  // Work queued from now on waits for what the caller queued on `stream`
  // (a cudaStream_t; 0 for the legacy default stream) before this call.
  void begin(uintptr_t stream) {
    const std::shared_ptr<rr::StreamMark> mark = device_->mark(stream);
    device_->begin(*mark);
  }

  // Device memory for `role`, at least `bytes`; kept and reused, its contents
  // whatever the last user left.
  uintptr_t buffer(const std::string& role, size_t bytes) {
    auto it = kept_.find(role);
    if (it != kept_.end() && it->second.second >= bytes) {
      return reinterpret_cast<uintptr_t>(it->second.first);
    }
    if (it != kept_.end()) {
      device_->release(it->second.first);
      kept_.erase(it);
    }
    void* p = device_->allocate(bytes);
    kept_[role] = {p, bytes};
    return reinterpret_cast<uintptr_t>(p);
  }

  // Frees kept buffers, largest first, until at most `limit` bytes stay kept:
  // device memory is scarce, and a huge call's scratch need not outlive it.
  void trim(size_t limit) {
    while (kept_bytes() > limit) {
      auto largest = std::max_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
        return a.second.second < b.second.second;
      });
      device_->release(largest->second.first);
      kept_.erase(largest);
    }
  }

  size_t kept_bytes() const {
    size_t total = 0;
    for (const auto& [role, kept] : kept_) total += kept.second;
    return total;
  }

  void encode(const std::string& name, uintptr_t x, size_t n, uint64_t key,
              const py::array& payload, uintptr_t residual, bool residual_out_only) {
    const rr::codec::CodecKind kind = rr::codec::codec_kind(name.c_str());
    const size_t bytes = rr::codec::payload_bytes(kind, n);
    uint8_t* host = rr::data_of<uint8_t>(payload, bytes, "payload", true);
    uint8_t* staged = at<uint8_t>(buffer("payload", aligned(bytes)));
    run([&] {
      device_->encode(rr::Lane::kToDevice, kind, at<const float>(x), at<float>(residual),
                      residual_out_only, n, key, staged, 0);
      device_->record(rr::Lane::kToDevice, 0);
      device_->lane_wait(rr::Lane::kToHost, 0);
      device_->copy(rr::Lane::kToHost, host, staged, bytes);
    });
  }

  void decode(const std::string& name, const py::array& payload, size_t n, uintptr_t out) {
    decode_into(name, std::vector<py::array>{payload}, n, out, false);
  }

  void decode_add(const std::string& name, const py::sequence& payloads, size_t n, uintptr_t acc) {
    std::vector<py::array> held;
    for (const py::handle& p : payloads) held.push_back(p.cast<py::array>());
    decode_into(name, held, n, acc, true);
  }

  void add(uintptr_t out, uintptr_t a, uintptr_t b, size_t n) {
    run([&] {
      device_->reduce(rr::Lane::kToDevice, rr::DataType::kFloat32, rr::ReduceOp::kSum, at(out),
                      at(a), at(b), n);
    });
  }

  void copy(uintptr_t dst, uintptr_t src, size_t bytes) {
    run([&] { device_->copy(rr::Lane::kToDevice, at(dst), at(src), bytes); });
  }

  void zero(uintptr_t ptr, size_t bytes) {
    run([&] { device_->zero(rr::Lane::kToDevice, at(ptr), bytes); });
  }

  void convert(int to, uintptr_t dst, int from, uintptr_t src, size_t n) {
    const rr::DataType t = rr::dtype_from_code(to), f = rr::dtype_from_code(from);
    run([&] { device_->convert(rr::Lane::kToDevice, t, at(dst), f, at(src), n); });
  }

  void divide(uintptr_t data, size_t n, int divisor) {
    run([&] {
      device_->divide(rr::Lane::kToDevice, rr::DataType::kFloat32, at(data), n, divisor);
    });
  }

 private:
  void decode_into(const std::string& name, const std::vector<py::array>& payloads, size_t n,
                   uintptr_t out, bool add) {
    const rr::codec::CodecKind kind = rr::codec::codec_kind(name.c_str());
    const size_t bytes = rr::codec::payload_bytes(kind, n), stride = aligned(bytes);
    std::vector<const uint8_t*> host;
    for (const py::array& p : payloads)
      host.push_back(rr::data_of<uint8_t>(p, bytes, "payload", false));
    if (host.empty()) return;
    uint8_t* staged = at<uint8_t>(buffer("payload", stride * host.size()));
    run([&] {
      for (size_t j = 0; j < host.size(); ++j) {
        device_->copy(rr::Lane::kToDevice, staged + j * stride, host[j], bytes);
      }
      if (add) {
        device_->decode_add(rr::Lane::kToDevice, kind, staged, stride, host.size(), n,
                            at<float>(out));
      } else {
        device_->decode(rr::Lane::kToDevice, kind, staged, n, at<float>(out));
      }
    });
  }

  // Queues the work and waits for it with the GIL released; an error while
  // queuing still waits for what was queued, so nothing runs on afterwards.
  template <typename Queue>
  void run(Queue queue) {
    py::gil_scoped_release nogil;
    rr::PythonInterrupt interrupt;
    const rr::Deadline deadline = rr::Deadline::after(timeout_, &interrupt);
    try {
      queue();
    } catch (...) {
      try {
        device_->finish(deadline);
      } catch (...) {
      }
      throw;
    }
    device_->finish(deadline);
  }

  std::unique_ptr<rr::Device> device_;
  double timeout_;
  std::map<std::string, std::pair<void*, size_t>> kept_;
};

}  // namespace

// Called by PYBIND11_MODULE in module.cc.
void register_device_codec(py::module_& m) {
  py::class_<DeviceCodec>(m, "DeviceCodec",
                          "The codec kernels on device memory (CUDA, or the CPU emulation "
                          "with fake=True), each call waited for.")
      .def(py::init<int, bool, double>(), py::arg("device"), py::arg("fake"),
           py::arg("timeout_seconds"))
      .def("begin", &DeviceCodec::begin, py::arg("stream"),
           "Later work waits for what the caller queued on `stream` before this.")
      .def("buffer", &DeviceCodec::buffer, py::arg("role"), py::arg("nbytes"),
           "Device memory for `role` (kept and reused): its address.")
      .def("trim", &DeviceCodec::trim, py::arg("limit"),
           "Frees kept buffers, largest first, until at most `limit` bytes stay kept.")
      .def_property_readonly("kept_bytes", &DeviceCodec::kept_bytes)
      .def("encode", &DeviceCodec::encode, py::arg("codec"), py::arg("x"), py::arg("n"),
           py::arg("key"), py::arg("payload"), py::arg("residual") = 0,
           py::arg("residual_out_only") = false,
           "The payload of n float32 values at device address x, into the host uint8 array "
           "payload; residual (a device address, 0 for none) as codec_encode's, or only "
           "written with residual_out_only.")
      .def("decode", &DeviceCodec::decode, py::arg("codec"), py::arg("payload"), py::arg("n"),
           py::arg("out"), "n float32 values at device address out = the host payload's.")
      .def("decode_add", &DeviceCodec::decode_add, py::arg("codec"), py::arg("payloads"),
           py::arg("n"), py::arg("acc"),
           "acc (device address) += each host payload's n values, in order, in float32.")
      .def("add", &DeviceCodec::add, py::arg("out"), py::arg("a"), py::arg("b"), py::arg("n"),
           "out = a + b, n float32 values at device addresses.")
      .def("copy", &DeviceCodec::copy, py::arg("dst"), py::arg("src"), py::arg("nbytes"),
           "dst = src; either may be host or device memory.")
      .def("zero", &DeviceCodec::zero, py::arg("ptr"), py::arg("nbytes"))
      .def("convert", &DeviceCodec::convert, py::arg("to"), py::arg("dst"), py::arg("from_"),
           py::arg("src"), py::arg("n"),
           "dst = src cast, float32 to or from float16 or bfloat16 (dtype codes).")
      .def("divide", &DeviceCodec::divide, py::arg("data"), py::arg("n"), py::arg("divisor"),
           "n float32 values /= divisor.");
}
