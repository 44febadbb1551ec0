#include "proto/sealing.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "crypto/aead.h"

namespace cloister::proto {

absl::StatusOr<std::span<uint8_t>> SerializeForSealing(const google::protobuf::MessageLite& message,
                                                       std::string& buffer) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX) - crypto::kAeadTagSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", size, " bytes is over the 2 GiB a message can carry"));
  }
  buffer.resize(size + crypto::kAeadTagSize);
  auto* data = reinterpret_cast<uint8_t*>(buffer.data());
  message.SerializeWithCachedSizesToArray(data);
  return std::span<uint8_t>(data, buffer.size());
}

}  // namespace cloister::proto
