// The `cloister` command line (cli.h): JSON and human-readable output of models and tensors.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "sdk/cli.h"
#include "sdk/cli_internal.h"
#include "sdk/npy.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

namespace cli_internal {

// ---- JSON output. ----

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

std::string ShapeJson(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string ShapeHuman(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d < 0 ? "?" : absl::StrCat(d));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

namespace {

std::string TensorInfosJson(const google::protobuf::RepeatedPtrField<api::TensorInfo>& infos) {
  std::vector<std::string> items;
  for (const api::TensorInfo& info : infos) {
    items.push_back(absl::StrCat("{\"name\":", JsonString(info.name()),
                                 ",\"datatype\":", JsonString(info.datatype()),
                                 ",\"shape\":", ShapeJson(info.shape()), "}"));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

absl::string_view KindName(api::ModelKind kind) {
  switch (kind) {
    case api::MODEL_KIND_ONNX: return "onnx";
    case api::MODEL_KIND_LLM: return "llm";
    default: return "unknown";
  }
}

}  // namespace

std::string ModelJson(const api::ModelInfo& model) {
  return absl::StrCat(
      "{\"name\":", JsonString(model.name()), ",\"handle\":", JsonString(model.handle()),
      ",\"size\":", model.size(), ",\"kind\":", JsonString(KindName(model.kind())),
      ",\"digest\":", JsonString(model.digest()),
      ",\"published\":", model.published() ? "true" : "false",
      ",\"inputs\":", TensorInfosJson(model.inputs()),
      ",\"outputs\":", TensorInfosJson(model.outputs()),
      ",\"rows_coalesce\":", model.rows_coalesce() ? "true" : "false",
      model.rows_coalesce()
          ? ""
          : absl::StrCat(",\"rows_shared_reason\":", JsonString(model.rows_shared_reason())),
      "}");
}

void PrintModelHuman(std::ostream& out, const api::ModelInfo& model) {
  out << model.name() << "  (" << KindName(model.kind()) << ", "
      << (model.published() ? "published by the operator, " : "") << "handle " << model.handle()
      << ", " << model.size() << " bytes)\n";
  out << "  digest  sha256:" << model.digest() << "\n";
  if (model.kind() == api::MODEL_KIND_LLM) {
    out << "  generative model: run it with Generate (Infer refuses it)\n";
    return;
  }
  for (const api::TensorInfo& info : model.inputs()) {
    out << "  input   " << info.name() << "  " << info.datatype() << " " << ShapeHuman(info.shape())
        << "\n";
  }
  for (const api::TensorInfo& info : model.outputs()) {
    out << "  output  " << info.name() << "  " << info.datatype() << " " << ShapeHuman(info.shape())
        << "\n";
  }
  if (model.rows_coalesce()) {
    out << "  batching: requests coalesce (each output row depends on its own input row only)\n";
  } else {
    out << "  batching: requests run one by one (" << model.rows_shared_reason() << ")\n";
  }
}

namespace {

float HalfToFloat(uint16_t half) {
  uint32_t sign = static_cast<uint32_t>(half >> 15) << 31;
  uint32_t exponent = (half >> 10) & 0x1f;
  uint32_t mantissa = half & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalize.
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ff;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

template <typename T>
T LoadLittleEndian(const char* data) {
  T value;
  std::memcpy(&value, data, sizeof(T));  // little-endian host (checked in npy.cc)
  return value;
}

std::string FloatJson(double value, int precision) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.*g", precision, value);
}

std::string PrintElement(const std::string& datatype, const char* p) {
  if (datatype == "FP32") return FloatJson(LoadLittleEndian<float>(p), 9);
  if (datatype == "FP64") return FloatJson(LoadLittleEndian<double>(p), 17);
  if (datatype == "FP16") return FloatJson(HalfToFloat(LoadLittleEndian<uint16_t>(p)), 5);
  if (datatype == "INT8") return absl::StrCat(LoadLittleEndian<int8_t>(p));
  if (datatype == "INT16") return absl::StrCat(LoadLittleEndian<int16_t>(p));
  if (datatype == "INT32") return absl::StrCat(LoadLittleEndian<int32_t>(p));
  if (datatype == "INT64") return absl::StrCat(LoadLittleEndian<int64_t>(p));
  if (datatype == "UINT8") return absl::StrCat(LoadLittleEndian<uint8_t>(p));
  if (datatype == "UINT16") return absl::StrCat(LoadLittleEndian<uint16_t>(p));
  if (datatype == "UINT32") return absl::StrCat(LoadLittleEndian<uint32_t>(p));
  if (datatype == "UINT64") return absl::StrCat(LoadLittleEndian<uint64_t>(p));
  if (datatype == "BOOL") return *p != 0 ? "true" : "false";
  CLOISTER_CHECK(false && "datatype was validated");
  return "";
}

}  // namespace
}  // namespace cli_internal

using cli_internal::JsonString;
using cli_internal::PrintElement;
using cli_internal::ShapeJson;

std::string SanitizeOutputName(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool safe =
        absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out.push_back(safe ? c : '_');
  }
  for (char& c : out) {
    if (c != '.') break;
    c = '_';
  }
  if (out.empty()) out = "output";
  return out;
}

absl::StatusOr<std::string> TensorToJson(const api::Tensor& tensor) {
  RETURN_IF_ERROR(ValidateTensor(tensor));
  size_t element_size = *DatatypeElementSize(tensor.datatype());
  std::string data;
  const std::string& raw = tensor.raw();
  for (size_t offset = 0; offset < raw.size(); offset += element_size) {
    if (offset > 0) data.push_back(',');
    data += PrintElement(tensor.datatype(), raw.data() + offset);
  }
  return absl::StrCat("{\"name\":", JsonString(tensor.name()),
                      ",\"datatype\":", JsonString(tensor.datatype()),
                      ",\"shape\":", ShapeJson(tensor.shape()), ",\"data\":[", data, "]}");
}

}  // namespace cloister::sdk
