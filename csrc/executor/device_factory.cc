#include <string>

#include "common/error.h"
#include "config.h"
#include "executor/devices.h"

namespace rr {

std::unique_ptr<Device> make_device(int device) {
#if RR_WITH_CUDA
  return make_cuda_device(device);
#else
  throw InvalidArgument("the arrays are on CUDA device " + std::to_string(device) +
                        ", but this ringreduce was built without CUDA; reinstall it where nvcc "
                        "is found (RINGREDUCE_WITH_CUDA=ON), or pass host arrays");
#endif
}

}  // namespace rr
