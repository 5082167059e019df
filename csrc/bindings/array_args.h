// Checks of the numpy arrays the codec bindings take (codec_bindings.cc,
// device_codec_bindings.cc): dtype, contiguity, size, writability, checked here,
// never converted, since a converted output would be a copy nobody reads.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "common/error.h"

namespace rr {

// The array's data, after checking that it is C-contiguous, of element type T,
// at least `n` elements long and, for outputs, writable.
template <typename T>
T* data_of(const pybind11::array& a, size_t n, const char* what, bool output) {
  if (!a.dtype().is(pybind11::dtype::of<T>())) {
    throw rr::InvalidArgument(std::string(what) + ": expected " +
                              std::string(pybind11::str(pybind11::dtype::of<T>())) + ", got " +
                              std::string(pybind11::str(a.dtype())));
  }
  if (!(a.flags() & pybind11::array::c_style)) {
    throw rr::InvalidArgument(std::string(what) + ": must be C-contiguous");
  }
  if (static_cast<size_t>(a.size()) < n) {
    throw rr::InvalidArgument(std::string(what) + ": needs " + std::to_string(n) +
                              " elements, has " + std::to_string(a.size()));
  }
  if (output && !a.writeable()) throw rr::InvalidArgument(std::string(what) + ": is read-only");
  return static_cast<T*>(const_cast<void*>(a.data()));
}

}  // namespace rr
