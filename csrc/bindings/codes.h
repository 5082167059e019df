// Raw integer codes from Python (the testing hooks take plain ints), checked
// before they become engine enums.
#pragma once

#include <string>

#include "common/dtype.h"
#include "common/error.h"

namespace rr {

inline DataType dtype_from_code(int value) {
  if (!valid_dtype(value)) throw InvalidArgument("unknown dtype code " + std::to_string(value));
  return static_cast<DataType>(value);
}

inline ReduceOp op_from_code(int value) {
  if (!valid_op(value)) throw InvalidArgument("unknown op code " + std::to_string(value));
  return static_cast<ReduceOp>(value);
}

}  // namespace rr
