#include "tests/support/tensor_files.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "onnx/onnx_pb.h"

namespace cloister::testing {
namespace {

absl::StatusOr<std::string> KServeType(int onnx_type) {
  switch (onnx_type) {
    case onnx::TensorProto::FLOAT: return std::string("FP32");
    case onnx::TensorProto::DOUBLE: return std::string("FP64");
    case onnx::TensorProto::INT64: return std::string("INT64");
    case onnx::TensorProto::INT32: return std::string("INT32");
    case onnx::TensorProto::UINT8: return std::string("UINT8");
    case onnx::TensorProto::INT8: return std::string("INT8");
    case onnx::TensorProto::BOOL: return std::string("BOOL");
    default: return absl::InvalidArgumentError(absl::StrCat("unsupported tensor type ", onnx_type));
  }
}

}  // namespace

absl::StatusOr<sdk::NpyArray> ReadTensorProtoFile(const std::string& path, std::string* name) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  onnx::TensorProto proto;
  if (!proto.ParseFromString(*bytes)) return absl::InvalidArgumentError(path + " is not a TensorProto");
  sdk::NpyArray array;
  auto type = KServeType(proto.data_type());
  if (!type.ok()) return type.status();
  array.datatype = *type;
  uint64_t count = 1;
  for (int64_t d : proto.dims()) {
    array.shape.push_back(d);
    count *= d;
  }
  if (name) *name = proto.name();
  if (!proto.raw_data().empty()) {
    array.data.assign(proto.raw_data().begin(), proto.raw_data().end());
  } else {
    auto append = [&](const void* p, size_t n) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      array.data.insert(array.data.end(), b, b + n);
    };
    switch (proto.data_type()) {
      case onnx::TensorProto::FLOAT:
        for (float v : proto.float_data()) append(&v, 4);
        break;
      case onnx::TensorProto::DOUBLE:
        for (double v : proto.double_data()) append(&v, 8);
        break;
      case onnx::TensorProto::INT64:
        for (int64_t v : proto.int64_data()) append(&v, 8);
        break;
      case onnx::TensorProto::INT32:
        for (int32_t v : proto.int32_data()) append(&v, 4);
        break;
      default:
        for (int32_t v : proto.int32_data()) {
          uint8_t b = static_cast<uint8_t>(v);
          append(&b, 1);
        }
    }
  }
  auto element = sdk::DatatypeElementSize(array.datatype);
  if (!element.ok()) return element.status();
  if (array.data.size() != count * *element) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": data size does not match its shape"));
  }
  return array;
}

std::string CompareArrays(const sdk::NpyArray& actual, const sdk::NpyArray& expected, double atol,
                          double rtol) {
  if (actual.datatype != expected.datatype) {
    return absl::StrCat("datatype ", actual.datatype, " != ", expected.datatype);
  }
  if (actual.shape != expected.shape) return "shapes differ";
  if (actual.data.size() != expected.data.size()) return "sizes differ";
  if (actual.datatype == "FP32") {
    size_t n = actual.data.size() / 4;
    for (size_t i = 0; i < n; ++i) {
      float a, b;
      std::memcpy(&a, actual.data.data() + 4 * i, 4);
      std::memcpy(&b, expected.data.data() + 4 * i, 4);
      if (!(std::fabs(a - b) <= atol + rtol * std::fabs(b))) {
        return absl::StrCat("element ", i, ": ", a, " vs expected ", b);
      }
    }
    return "";
  }
  return actual.data == expected.data ? "" : "values differ";
}

}  // namespace cloister::testing
