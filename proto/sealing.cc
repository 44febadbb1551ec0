#include "proto/sealing.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "crypto/aead.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace cloister::proto {
namespace {

// Sizes `buffer` for a serialization of `size` bytes and the AEAD tag after it; the whole span
// to seal in place. InvalidArgument (the buffer left alone) past what a message can carry.
absl::StatusOr<std::span<uint8_t>> BufferForSealing(size_t size, std::string& buffer) {
  if (size > static_cast<size_t>(INT_MAX) - crypto::kAeadTagSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", size, " bytes is over the 2 GiB a message can carry"));
  }
  buffer.resize(size + crypto::kAeadTagSize);
  return std::span<uint8_t>(reinterpret_cast<uint8_t*>(buffer.data()), buffer.size());
}

}  // namespace

absl::StatusOr<std::span<uint8_t>> SerializeForSealing(const google::protobuf::MessageLite& message,
                                                       std::string& buffer) {
  ASSIGN_OR_RETURN(std::span<uint8_t> sealed, BufferForSealing(message.ByteSizeLong(), buffer));
  message.SerializeWithCachedSizesToArray(sealed.data());
  return sealed;
}

absl::StatusOr<std::span<uint8_t>> SerializeInferRequestForSealing(
    const std::vector<api::v1::Tensor>& inputs, const std::vector<std::string>& outputs,
    std::string& buffer) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  // Each element of a repeated message or string field: its tag, its length, its bytes.
  const uint32_t input_tag = WireFormatLite::MakeTag(
      api::v1::InferRequestPayload::kInputsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  const uint32_t output_tag = WireFormatLite::MakeTag(
      api::v1::InferRequestPayload::kOutputsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  size_t size = 0;
  for (const api::v1::Tensor& input : inputs) {
    const size_t length = input.ByteSizeLong();  // also caches the sizes serialization uses
    size += CodedOutputStream::VarintSize32(input_tag) + CodedOutputStream::VarintSize64(length) +
            length;
  }
  for (const std::string& output : outputs) {
    size += CodedOutputStream::VarintSize32(output_tag) +
            CodedOutputStream::VarintSize64(output.size()) + output.size();
  }
  ASSIGN_OR_RETURN(std::span<uint8_t> sealed, BufferForSealing(size, buffer));
  uint8_t* out = sealed.data();
  for (const api::v1::Tensor& input : inputs) {
    out = CodedOutputStream::WriteVarint32ToArray(input_tag, out);
    out = CodedOutputStream::WriteVarint64ToArray(input.GetCachedSize(), out);
    out = input.SerializeWithCachedSizesToArray(out);
  }
  for (const std::string& output : outputs) {
    out = CodedOutputStream::WriteVarint32ToArray(output_tag, out);
    out = CodedOutputStream::WriteVarint64ToArray(output.size(), out);
    out = CodedOutputStream::WriteRawToArray(output.data(), static_cast<int>(output.size()), out);
  }
  return sealed;
}

}  // namespace cloister::proto
