// Small helpers shared by the CPU kernel files: type checks with uniform messages, shape
// arithmetic, load-time size checks, float16 conversion. Threading: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

// Fails unless input `index` (when present) satisfies `accepted`.
template <typename Predicate>
absl::Status RequireType(const NodeContext& context, int index, Predicate accepted) {
  if (!context.has_input(index) || accepted(context.input(index).dtype)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input ", index, " ('", context.node().input(index),
                   "') has unsupported element type ", TypeName(context.input(index).dtype)));
}

// Fails unless inputs `a` and `b` have the same element type.
inline absl::Status RequireSameType(const NodeContext& context, int a, int b) {
  if (!context.has_input(a) || !context.has_input(b) ||
      context.input(a).dtype == context.input(b).dtype) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("inputs ", a, " and ", b, " must have the same element type, got ",
                   TypeName(context.input(a).dtype), " and ", TypeName(context.input(b).dtype)));
}

// Reads a constant integer tensor (int32 or int64) as int64 values.
inline std::vector<int64_t> ToInt64Vector(const Tensor& tensor) {
  std::vector<int64_t> values(tensor.count());
  if (tensor.count() == 0) return values;
  if (tensor.dtype() == DataType::kInt64) {
    std::memcpy(values.data(), tensor.raw_data(), tensor.size());
  } else {
    const int32_t* data = tensor.data<int32_t>();
    for (int64_t i = 0; i < tensor.count(); ++i) values[i] = data[i];
  }
  return values;
}

inline bool IsIndexType(DataType dtype) {
  return dtype == DataType::kInt64 || dtype == DataType::kInt32;
}

inline bool IsFloat32(DataType t) { return t == DataType::kFloat; }

// The spatial dimensions of an [N, C, spatial...] shape.
inline std::vector<int64_t> SpatialOf(const std::vector<int64_t>& dims) {
  return std::vector<int64_t>(dims.begin() + 2, dims.end());
}

// Product of dims [begin, end).
inline int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t product = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) product *= dims[i];
  return product;
}

// Refuses at load a shape that is fully known from constants and larger than any run could
// produce (KernelContext::Output refuses more than kMaxOutputSize bytes), so a small model cannot
// declare a huge tensor. Unknown (-1) dimensions pass.
inline absl::Status CheckKnownShapeSize(DataType dtype, const std::vector<int64_t>& dims) {
  for (int64_t d : dims) {
    if (d < 0) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int64_t count, ElementCount(dims));
  if (static_cast<uint64_t>(count) > kMaxOutputSize / ElementSize(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("output of shape ", ShapeToString(dims), " is too large"));
  }
  return absl::OkStatus();
}

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// Wraps a kernel object into the factory's return type.
template <typename K, typename... Args>
absl::StatusOr<std::unique_ptr<Kernel>> MakeKernel(Args&&... args) {
  return std::unique_ptr<Kernel>(new K(std::forward<Args>(args)...));
}

}  // namespace cloister::runtime
