// Conversion between onnx::TensorProto (as found in models and in the ONNX backend test data)
// and runtime Tensors. Refuses external data, segments and string tensors.
// Threading: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "enclave/runtime/tensor.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {

// Maps onnx::TensorProto::DataType to DataType; InvalidArgument for types we do not carry
// (bfloat16, complex, float8) and for UNDEFINED.
absl::StatusOr<DataType> DataTypeFromOnnx(int onnx_type);
int OnnxDataType(DataType dtype);

// Copies a TensorProto into a Tensor, checking that the data fills the declared shape exactly.
absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& proto);
// Copies a Tensor into a TensorProto (raw_data form) named `name`.
onnx::TensorProto TensorToProto(const Tensor& tensor, const std::string& name);

}  // namespace cloister::runtime
