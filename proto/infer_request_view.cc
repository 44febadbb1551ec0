#include "proto/infer_request_view.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/wipe.h"

namespace cloister::proto {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kInputsField = 1;  // InferRequestPayload.inputs
constexpr int kRawField = 4;     // Tensor.raw

// One field of a message's wire bytes: its tag and the bytes it spans, tag included.
struct Field {
  uint32_t tag = 0;
  size_t begin = 0;
  size_t end = 0;
  // For a length-delimited field: where its contents start.
  size_t contents = 0;
};

// Reads the fields of `bytes` one by one (nothing after the last), as protobuf's parser would
// delimit them; nullopt when they cannot be delimited (a bad tag, varint or length, a group
// that does not close, bytes past the end).
class FieldReader {
 public:
  explicit FieldReader(ByteSpan bytes)
      : bytes_(bytes), input_(bytes.data(), static_cast<int>(bytes.size())) {}

  // The next field; nullopt at the end (done() true) or on malformed bytes (done() false).
  std::optional<Field> Next() {
    Field field;
    field.begin = static_cast<size_t>(input_.CurrentPosition());
    field.tag = input_.ReadTag();
    if (field.tag == 0) {
      done_ = static_cast<size_t>(input_.CurrentPosition()) == bytes_.size() &&
              field.begin == bytes_.size();
      return std::nullopt;
    }
    if (WireFormatLite::GetTagWireType(field.tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length = 0;
      if (!input_.ReadVarint32(&length)) return std::nullopt;
      field.contents = static_cast<size_t>(input_.CurrentPosition());
      if (length > bytes_.size() - field.contents || !input_.Skip(static_cast<int>(length))) {
        return std::nullopt;
      }
    } else if (!WireFormatLite::SkipField(&input_, field.tag)) {
      return std::nullopt;
    }
    field.end = static_cast<size_t>(input_.CurrentPosition());
    return field;
  }

  bool done() const { return done_; }

 private:
  ByteSpan bytes_;
  CodedInputStream input_;
  bool done_ = false;
};

bool IsField(const Field& field, int number, WireFormatLite::WireType type) {
  return WireFormatLite::GetTagFieldNumber(field.tag) == number &&
         WireFormatLite::GetTagWireType(field.tag) == type;
}

// One Tensor's bytes: `raw` as a view (the last one, as the parser keeps), the rest parsed.
bool ReadTensor(ByteSpan bytes, InferRequestView::Input& out) {
  FieldReader reader(bytes);
  std::string rest;
  while (std::optional<Field> field = reader.Next()) {
    if (IsField(*field, kRawField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      out.raw = bytes.subspan(field->contents, field->end - field->contents);
    } else {
      rest.append(reinterpret_cast<const char*>(bytes.data() + field->begin),
                  field->end - field->begin);
    }
  }
  const bool parsed = reader.done() && out.meta.ParseFromString(rest);
  WipeString(rest);  // names and shapes are the tenant's too
  return parsed;
}

}  // namespace

bool ReadInferRequestView(ByteSpan bytes, InferRequestView& out) {
  out = InferRequestView();
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  FieldReader reader(bytes);
  std::string rest;
  bool tensors_read = true;
  while (std::optional<Field> field = reader.Next()) {
    if (IsField(*field, kInputsField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      InferRequestView::Input& input = out.inputs.emplace_back();
      tensors_read =
          ReadTensor(bytes.subspan(field->contents, field->end - field->contents), input);
      if (!tensors_read) break;
    } else {
      rest.append(reinterpret_cast<const char*>(bytes.data() + field->begin),
                  field->end - field->begin);
    }
  }
  const bool parsed = tensors_read && reader.done() && out.rest.ParseFromString(rest);
  WipeString(rest);
  return parsed;
}

}  // namespace cloister::proto
