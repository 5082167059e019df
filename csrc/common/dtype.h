// Element types and reduction operators known to the engine.
//
// The engine is type-erased: algorithms move bytes and call a reduction function
// picked from a (DataType x ReduceOp) table, so nothing above csrc/reduce is
// templated on the element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rr {

// The numbering is part of the wire header and of the Python bindings: append only.
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};
constexpr int kNumDataTypes = 8;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,  // sum, then divide by the number of ranks (floating types only)
};
constexpr int kNumReduceOps = 5;

size_t dtype_size(DataType dtype);
const char* dtype_name(DataType dtype);
bool is_floating(DataType dtype);
const char* op_name(ReduceOp op);

// Validates raw integers coming from the bindings or from the wire.
bool valid_dtype(int value);
bool valid_op(int value);

}  // namespace rr
