// The element-wise arithmetic of every (dtype x op), as functors shared by the
// CPU kernels and the CUDA kernels, so both sides run the same function.
//
// Terms: a Storage type is what sits in memory (uint16_t for float16/bfloat16);
// a Compute type is what arithmetic happens in (float for the 16-bit floats,
// so each hop of the ring computes in float32 and rounds to nearest even).
// Integer arithmetic wraps around modulo 2^bits, like numpy.
#pragma once

#include <cstdint>
#include <type_traits>

#include "reduce/half.h"

namespace rr {

template <typename Storage, typename Compute>
struct PlainType {
  using storage = Storage;
  using compute = Compute;
  static RR_HD Compute load(Storage v) { return v; }
  static RR_HD Storage store(Compute v) { return v; }
};

struct Float16Type {
  using storage = uint16_t;
  using compute = float;
  static RR_HD float load(uint16_t v) { return half_to_float(v); }
  static RR_HD uint16_t store(float v) { return float_to_half(v); }
};

struct BFloat16Type {
  using storage = uint16_t;
  using compute = float;
  static RR_HD float load(uint16_t v) { return bfloat16_to_float(v); }
  static RR_HD uint16_t store(float v) { return float_to_bfloat16(v); }
};

using Float32Type = PlainType<float, float>;
using Float64Type = PlainType<double, double>;
using Int8Type = PlainType<int8_t, int8_t>;
using UInt8Type = PlainType<uint8_t, uint8_t>;
using Int32Type = PlainType<int32_t, int32_t>;
using Int64Type = PlainType<int64_t, int64_t>;

// Signed overflow is undefined in C++, so integer sums and products go through
// the unsigned type of the same width, which wraps the way numpy does.
template <typename T, bool = std::is_integral<T>::value>
struct Wrap {
  using type = T;
};
template <typename T>
struct Wrap<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using WrapType = typename Wrap<T>::type;

struct SumOp {
  template <typename T>
  RR_HD T operator()(T a, T b) const {
    return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
  }
};

struct ProdOp {
  template <typename T>
  RR_HD T operator()(T a, T b) const {
    // Promote narrow unsigned types past int so the multiply cannot overflow int.
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, WrapType<T>>;
    return static_cast<T>(static_cast<W>(static_cast<WrapType<T>>(a)) *
                          static_cast<W>(static_cast<WrapType<T>>(b)));
  }
};

// min/max propagate NaN like numpy.minimum/maximum: a NaN operand wins.
struct MinOp {
  template <typename T>
  RR_HD T operator()(T a, T b) const {
    const T m = b < a ? b : a;
    return a != a ? a : (b != b ? b : m);
  }
};

struct MaxOp {
  template <typename T>
  RR_HD T operator()(T a, T b) const {
    const T m = a < b ? b : a;
    return a != a ? a : (b != b ? b : m);
  }
};

// One element of out = a op b.
template <typename Type, typename Op>
RR_HD typename Type::storage apply(typename Type::storage a, typename Type::storage b) {
  return Type::store(Op()(Type::load(a), Type::load(b)));
}

}  // namespace rr
