// The codec kernels (kernels/codec.h) in ringreduce._core, for
// python/ringreduce/compression/codecs.py: numpy arrays in and out through
// the buffer protocol, checked here (dtype, contiguity, size, writability),
// never converted, since a converted output would be a copy nobody reads.
// The loops run with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/array_args.h"
#include "common/error.h"
#include "kernels/codec.h"

namespace py = pybind11;

namespace {

using rr::data_of;

void encode(const std::string& name, const py::array& x, uint64_t key, const py::array& payload,
            const py::object& residual, uint64_t first) {
  const rr::codec::CodecKind kind = rr::codec::codec_kind(name.c_str());
  const size_t n = static_cast<size_t>(x.size());
  const float* values = data_of<float>(x, n, "x", false);
  uint8_t* out = data_of<uint8_t>(payload, rr::codec::payload_bytes(kind, n), "payload", true);
  float* owed = nullptr;
  if (!residual.is_none()) {
    const py::array r = residual.cast<py::array>();
    if (static_cast<size_t>(r.size()) != n) {
      throw rr::InvalidArgument("residual: needs exactly " + std::to_string(n) + " elements");
    }
    owed = data_of<float>(r, n, "residual", true);
  }
  py::gil_scoped_release nogil;
  rr::codec::encode(kind, values, owed, n, key, out, first);
}

void decode(const std::string& name, const py::array& payload, size_t n, const py::array& out) {
  const rr::codec::CodecKind kind = rr::codec::codec_kind(name.c_str());
  const uint8_t* in =
      data_of<uint8_t>(payload, rr::codec::payload_bytes(kind, n), "payload", false);
  float* values = data_of<float>(out, n, "out", true);
  py::gil_scoped_release nogil;
  rr::codec::decode(kind, in, n, values);
}

void decode_add(const std::string& name, const py::sequence& payloads, size_t n,
                const py::array& acc) {
  const rr::codec::CodecKind kind = rr::codec::codec_kind(name.c_str());
  const size_t bytes = rr::codec::payload_bytes(kind, n);
  std::vector<py::array> held;  // kept referenced while the GIL is released
  std::vector<const uint8_t*> in;
  for (const py::handle& p : payloads) {
    held.push_back(p.cast<py::array>());
    in.push_back(data_of<uint8_t>(held.back(), bytes, "payloads[i]", false));
  }
  float* sum = data_of<float>(acc, n, "acc", true);
  py::gil_scoped_release nogil;
  rr::codec::decode_add(kind, in.data(), in.size(), n, sum);
}

}  // namespace

// Called by PYBIND11_MODULE in module.cc.
void register_codecs(py::module_& m) {
  m.def(
      "codec_payload_bytes",
      [](const std::string& name, size_t n) {
        return rr::codec::payload_bytes(rr::codec::codec_kind(name.c_str()), n);
      },
      py::arg("codec"), py::arg("n"), "The payload size of n values (codecs.py's payload_bytes).");
  m.def("codec_encode", &encode, py::arg("codec"), py::arg("x"), py::arg("key"), py::arg("payload"),
        py::arg("residual") = py::none(), py::arg("first") = 0,
        "Encodes the float32 array x into the uint8 array payload with stochastic-rounding "
        "key `key` (64 bits). With a residual (float32, x's length): encodes x + residual "
        "and leaves in residual what the encode dropped. `first`: x[0]'s index in the array "
        "x is a piece of (the dither is a function of it).");
  m.def("codec_decode", &decode, py::arg("codec"), py::arg("payload"), py::arg("n"), py::arg("out"),
        "out[:n] = the n float32 values the uint8 array payload stands for.");
  m.def("codec_decode_add", &decode_add, py::arg("codec"), py::arg("payloads"), py::arg("n"),
        py::arg("acc"),
        "acc[:n] += each payload's n decoded values, in float32 and in the payloads' order.");
  m.def("codec_kernel_isa", &rr::codec::codec_kernel_isa,
        "The instruction set the codec kernels run with (\"avx512\", \"avx2\" or \"generic\").");
  m.def("codec_kernel_isas", &rr::codec::runnable_kernel_isas,
        "The instruction sets of the codec kernels this machine runs, best first.");
  m.def("use_codec_kernel_isa", &rr::codec::use_kernel_isa, py::arg("isa"),
        "Runs the codec kernels with one of codec_kernel_isas() in this process from now on "
        "(every one computes the same bits; for tests and benchmarks).");
}
