#include "enclave/runtime/onnx_tensor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::runtime {
namespace {

using onnx::TensorProto;

// ONNX element type codes of the types we carry.
struct OnnxTypeEntry {
  int onnx_type;
  DataType dtype;
};
constexpr OnnxTypeEntry kOnnxTypes[] = {
    {TensorProto::FLOAT, DataType::kFloat},     {TensorProto::DOUBLE, DataType::kDouble},
    {TensorProto::FLOAT16, DataType::kFloat16}, {TensorProto::INT8, DataType::kInt8},
    {TensorProto::INT16, DataType::kInt16},     {TensorProto::INT32, DataType::kInt32},
    {TensorProto::INT64, DataType::kInt64},     {TensorProto::UINT8, DataType::kUint8},
    {TensorProto::UINT16, DataType::kUint16},   {TensorProto::UINT32, DataType::kUint32},
    {TensorProto::UINT64, DataType::kUint64},   {TensorProto::BOOL, DataType::kBool},
    {TensorProto::STRING, DataType::kString},
};

// Copies repeated-field values into the tensor, converting each to T.
template <typename T, typename Field>
void CopyField(const Field& field, Tensor& tensor) {
  T* out = static_cast<T*>(tensor.raw_data());
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<T>(field.Get(i));
}

// The element type of a tensor we can load; InvalidArgument for external data, segments and
// types we do not carry.
absl::StatusOr<DataType> LoadableDataType(const TensorProto& proto, const std::string& label) {
  if (proto.data_location() == TensorProto::EXTERNAL || proto.external_data_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " uses external data, which is refused: embed the weights"));
  }
  if (proto.has_segment()) {
    return absl::InvalidArgumentError(absl::StrCat(label, " is segmented, which is refused"));
  }
  auto dtype = DataTypeFromOnnx(proto.data_type());
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", dtype.status().message()));
  if (*dtype == DataType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": string tensors are not supported"));
  }
  return *dtype;
}

// Checks that the data fills the shape, before anything is allocated for it.
absl::Status CheckDataFillsShape(const TensorProto& proto, DataType dtype,
                                 const std::vector<int64_t>& shape, const std::string& label) {
  auto declared = ElementCount(shape);
  if (!declared.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", declared.status().message()));
  }
  int64_t available = 0;
  if (proto.has_raw_data()) {
    available = static_cast<int64_t>(proto.raw_data().size() / ElementSize(dtype));
  } else {
    available = std::max({proto.float_data_size(), proto.int32_data_size(), proto.int64_data_size(),
                          proto.double_data_size(), proto.uint64_data_size()});
  }
  if (available != *declared) {
    return absl::InvalidArgumentError(absl::StrCat(label, " holds ", available,
                                                   " elements for shape ", ShapeToString(shape),
                                                   " (", *declared, " expected)"));
  }
  return absl::OkStatus();
}

// Copies raw_data into the tensor, booleans normalized to 0 and 1.
absl::Status CopyRawData(const TensorProto& proto, const std::string& label, Tensor& tensor) {
  if (proto.raw_data().size() != tensor.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " has ", proto.raw_data().size(), " bytes of raw data for shape ",
                     ShapeToString(tensor.shape()), " (", tensor.size(), " expected)"));
  }
  if (tensor.size() > 0) std::memcpy(tensor.raw_data(), proto.raw_data().data(), tensor.size());
  if (tensor.dtype() == DataType::kBool) {
    uint8_t* bytes = static_cast<uint8_t*>(tensor.raw_data());
    for (int64_t i = 0; i < tensor.count(); ++i) bytes[i] = bytes[i] != 0;
  }
  return absl::OkStatus();
}

// Copies the typed repeated field that holds the tensor's element type.
absl::Status CopyTypedData(const TensorProto& proto, const std::string& label, Tensor& tensor) {
  const int64_t count = tensor.count();
  auto mismatch = [&](int64_t have) {
    return absl::InvalidArgumentError(absl::StrCat(label, " has ", have, " elements for shape ",
                                                   ShapeToString(tensor.shape()), " (", count,
                                                   " expected)"));
  };
  switch (tensor.dtype()) {
    case DataType::kFloat:
      if (proto.float_data_size() != count) return mismatch(proto.float_data_size());
      CopyField<float>(proto.float_data(), tensor);
      break;
    case DataType::kDouble:
      if (proto.double_data_size() != count) return mismatch(proto.double_data_size());
      CopyField<double>(proto.double_data(), tensor);
      break;
    case DataType::kInt64:
      if (proto.int64_data_size() != count) return mismatch(proto.int64_data_size());
      CopyField<int64_t>(proto.int64_data(), tensor);
      break;
    case DataType::kUint32:
      if (proto.uint64_data_size() != count) return mismatch(proto.uint64_data_size());
      CopyField<uint32_t>(proto.uint64_data(), tensor);
      break;
    case DataType::kUint64:
      if (proto.uint64_data_size() != count) return mismatch(proto.uint64_data_size());
      CopyField<uint64_t>(proto.uint64_data(), tensor);
      break;
    case DataType::kInt32:
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      CopyField<int32_t>(proto.int32_data(), tensor);
      break;
    case DataType::kInt16:
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      CopyField<int16_t>(proto.int32_data(), tensor);
      break;
    case DataType::kInt8:
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      CopyField<int8_t>(proto.int32_data(), tensor);
      break;
    case DataType::kUint16:
    case DataType::kFloat16:
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      CopyField<uint16_t>(proto.int32_data(), tensor);
      break;
    case DataType::kUint8:
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      CopyField<uint8_t>(proto.int32_data(), tensor);
      break;
    case DataType::kBool: {
      if (proto.int32_data_size() != count) return mismatch(proto.int32_data_size());
      uint8_t* out = static_cast<uint8_t*>(tensor.raw_data());
      for (int64_t i = 0; i < count; ++i) out[i] = proto.int32_data(i) != 0;
      break;
    }
    case DataType::kString:
      break;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DataType> DataTypeFromOnnx(int onnx_type) {
  for (const OnnxTypeEntry& type : kOnnxTypes) {
    if (type.onnx_type == onnx_type) return type.dtype;
  }
  std::string name = TensorProto::DataType_IsValid(onnx_type)
                         ? TensorProto::DataType_Name(static_cast<TensorProto::DataType>(onnx_type))
                         : std::to_string(onnx_type);
  return absl::InvalidArgumentError(absl::StrCat("element type ", name, " is not supported"));
}

int OnnxDataType(DataType dtype) {
  for (const OnnxTypeEntry& type : kOnnxTypes) {
    if (type.dtype == dtype) return type.onnx_type;
  }
  return TensorProto::UNDEFINED;
}

absl::StatusOr<Tensor> TensorFromProto(const TensorProto& proto) {
  const std::string label = proto.name().empty() ? "tensor" : "tensor '" + proto.name() + "'";
  ASSIGN_OR_RETURN(const DataType dtype, LoadableDataType(proto, label));
  std::vector<int64_t> shape(proto.dims().begin(), proto.dims().end());
  RETURN_IF_ERROR(CheckDataFillsShape(proto, dtype, shape, label));
  auto created = Tensor::Create(dtype, shape);
  if (!created.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", created.status().message()));
  }
  Tensor tensor = std::move(created).value();
  if (proto.has_raw_data()) {
    RETURN_IF_ERROR(CopyRawData(proto, label, tensor));
  } else {
    RETURN_IF_ERROR(CopyTypedData(proto, label, tensor));
  }
  return tensor;
}

TensorProto TensorToProto(const Tensor& tensor, const std::string& name) {
  TensorProto proto;
  proto.set_name(name);
  proto.set_data_type(OnnxDataType(tensor.dtype()));
  for (int64_t dim : tensor.shape()) proto.add_dims(dim);
  proto.set_raw_data(static_cast<const char*>(tensor.raw_data()), tensor.size());
  return proto;
}

}  // namespace cloister::runtime
