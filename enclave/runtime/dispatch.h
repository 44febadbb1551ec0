// Type dispatch for kernels: run a generic lambda with the C++ element type of a DataType.
// A lambda receives a value of the element type (only its type matters); for unsupported types
// the dispatch returns false so the caller can report an error.
// Threading: pure functions.
#pragma once

#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

// Floating types the arithmetic kernels support.
template <typename F>
bool DispatchFloat(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat:
      f(float{});
      return true;
    case DataType::kDouble:
      f(double{});
      return true;
    default:
      return false;
  }
}

// Every numeric type (not bool, not float16).
template <typename F>
bool DispatchNumeric(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat:
      f(float{});
      return true;
    case DataType::kDouble:
      f(double{});
      return true;
    case DataType::kInt8:
      f(int8_t{});
      return true;
    case DataType::kInt16:
      f(int16_t{});
      return true;
    case DataType::kInt32:
      f(int32_t{});
      return true;
    case DataType::kInt64:
      f(int64_t{});
      return true;
    case DataType::kUint8:
      f(uint8_t{});
      return true;
    case DataType::kUint16:
      f(uint16_t{});
      return true;
    case DataType::kUint32:
      f(uint32_t{});
      return true;
    case DataType::kUint64:
      f(uint64_t{});
      return true;
    default:
      return false;
  }
}

// Numeric types plus bool.
template <typename F>
bool DispatchNumericOrBool(DataType dtype, F&& f) {
  if (dtype == DataType::kBool) {
    f(bool{});
    return true;
  }
  return DispatchNumeric(dtype, f);
}

// Types that kernels which only move elements accept (all but strings).
inline bool IsMovable(DataType dtype) { return dtype != DataType::kString; }

inline bool IsFloat(DataType dtype) {
  return dtype == DataType::kFloat || dtype == DataType::kDouble;
}
inline bool IsNumeric(DataType dtype) {
  return dtype != DataType::kBool && dtype != DataType::kString && dtype != DataType::kFloat16;
}
inline bool IsSignedOrFloat(DataType dtype) {
  return IsFloat(dtype) || dtype == DataType::kInt8 || dtype == DataType::kInt16 ||
         dtype == DataType::kInt32 || dtype == DataType::kInt64;
}

// Same-size element copies: the kernels that only move elements dispatch on size.
template <typename F>
bool DispatchBySize(DataType dtype, F&& f) {
  switch (ElementSize(dtype)) {
    case 1:
      f(uint8_t{});
      return true;
    case 2:
      f(uint16_t{});
      return true;
    case 4:
      f(uint32_t{});
      return true;
    case 8:
      f(uint64_t{});
      return true;
    default:
      return false;
  }
}

}  // namespace cloister::runtime
