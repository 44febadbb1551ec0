// Type dispatch for kernels: a list of C++ element types (ElementTypes<...>) names a set of
// DataTypes. Dispatch runs a generic lambda with the element type of a DataType in the set and
// Contains says whether a DataType is in it, so that a factory's load-time type check and its
// kernel's dispatch read the same list. A lambda receives a value of the element type (only its
// type matters); for types outside the set the dispatch returns false so the caller can report
// an error.
// Threading: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

template <typename... Ts>
struct ElementTypes {
  static constexpr bool Contains(DataType dtype) {
    return ((DataTypeOf<Ts>::value == dtype) || ...);
  }
  // Runs f(T{}) for the T of Ts whose DataType is `dtype`; false when there is none.
  template <typename F>
  static bool Dispatch(DataType dtype, F&& f) {
    return First([dtype](auto tag) { return DataTypeOf<decltype(tag)>::value == dtype; }, f);
  }
  // Runs f(T{}) for the first T of Ts that is `size` bytes long; false when there is none.
  template <typename F>
  static bool DispatchSize(size_t size, F&& f) {
    return First([size](auto tag) { return sizeof(tag) == size; }, f);
  }

 private:
  template <typename Matches, typename F>
  static bool First(const Matches& matches, F& f) {
    return ((matches(Ts{}) && (static_cast<void>(f(Ts{})), true)) || ...);
  }
};

// Floating types the arithmetic kernels support.
using FloatTypes = ElementTypes<float, double>;
using SignedOrFloatTypes = ElementTypes<float, double, int8_t, int16_t, int32_t, int64_t>;
// Every numeric type (not bool, not float16).
using NumericTypes = ElementTypes<float, double, int8_t, int16_t, int32_t, int64_t, uint8_t,
                                  uint16_t, uint32_t, uint64_t>;
using NumericOrBoolTypes = ElementTypes<float, double, int8_t, int16_t, int32_t, int64_t, uint8_t,
                                        uint16_t, uint32_t, uint64_t, bool>;
using BoolTypes = ElementTypes<bool>;
// Every type a tensor can hold (float16 as its bit pattern).
using TensorTypes = ElementTypes<float, double, Float16Bits, int8_t, int16_t, int32_t, int64_t,
                                 uint8_t, uint16_t, uint32_t, uint64_t, bool>;

// Types that kernels which only move elements accept (all but strings).
inline bool IsMovable(DataType dtype) { return dtype != DataType::kString; }

inline bool IsFloat(DataType dtype) { return FloatTypes::Contains(dtype); }
inline bool IsNumeric(DataType dtype) { return NumericTypes::Contains(dtype); }
inline bool IsNumericOrBool(DataType dtype) { return NumericOrBoolTypes::Contains(dtype); }
inline bool IsSignedOrFloat(DataType dtype) { return SignedOrFloatTypes::Contains(dtype); }

// Same-size element copies: the kernels that only move elements dispatch on size.
template <typename F>
bool DispatchBySize(DataType dtype, F&& f) {
  return ElementTypes<uint8_t, uint16_t, uint32_t, uint64_t>::DispatchSize(ElementSize(dtype), f);
}

}  // namespace cloister::runtime
