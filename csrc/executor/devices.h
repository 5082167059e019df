// Where Device implementations (executor/device.h) come from. The only
// place that knows whether this build has CUDA is make_device().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "executor/device.h"

namespace rr {

// The Device for CUDA device `device`: CUDA streams and events in a build with
// CUDA. Throws InvalidArgument without, so the call fails on the calling rank
// before any communication.
std::unique_ptr<Device> make_device(int device);

// The CPU emulation of a device (fake_device.cc), built always; the
// communicator uses it for every device when its options say so (tests,
// RINGREDUCE_TEST_FAKE_DEVICE=1). "Device"
// memory is host memory and every operation is a memcpy or a CPU kernel, run
// as late as the events allow, so a missing wait shows up as wrong data.
std::unique_ptr<Device> make_fake_device(int device);

// Tests: the callers' streams of the fake device. fake_stream_write queues, on
// the stream with handle `stream`, a write of `bytes` at `dst`, which runs
// only once something waits for that stream's work: a collective on the fake
// device that the caller submitted on that stream after it, or
// fake_stream_sync(stream).
void fake_stream_write(uintptr_t stream, void* dst, std::string bytes);
void fake_stream_sync(uintptr_t stream);

// cuda_device.cc, only in a build with CUDA.
std::unique_ptr<Device> make_cuda_device(int device);

}  // namespace rr
