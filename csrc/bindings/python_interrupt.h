// Ctrl-C while the engine waits: a blocking call runs with the GIL released,
// and every 100 ms this takes the GIL to let Python run its signal handlers.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>

#include "common/error.h"
#include "engine/communicator.h"

namespace rr {

class PythonInterrupt final : public Interrupt {
 public:
  PythonInterrupt() : Interrupt(std::chrono::milliseconds(100)) {}
  // Runs Python's signal handlers; if one raised (KeyboardInterrupt), leaves
  // that error set for the bindings to re-raise and abandons the wait.
  void check() const override {
    pybind11::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw Interrupted("interrupted by a signal");
  }
};

}  // namespace rr
