// Test support: reads ONNX TensorProto files (the backend test layout of shared/models/testdata)
// and compares tensors within the suite's tolerance |a-b| <= atol + rtol*|b|.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "sdk/npy.h"

namespace cloister::testing {

// Reads a serialized onnx.TensorProto (raw_data or typed fields) as an NpyArray; also
// returns the tensor's name through `name` when not null.
absl::StatusOr<sdk::NpyArray> ReadTensorProtoFile(const std::string& path, std::string* name = nullptr);

// Empty string when `actual` matches `expected` (same datatype and shape, FP32 values within
// tolerance, other types exactly); otherwise a description of the first mismatch.
std::string CompareArrays(const sdk::NpyArray& actual, const sdk::NpyArray& expected,
                          double atol = 1e-3, double rtol = 1e-3);

}  // namespace cloister::testing
