// Buffers for sealing protobuf messages in place (crypto::ChannelSender::SealInPlace): the
// message is serialized straight into the string that carries it on the wire, so its plaintext
// never exists in a second buffer that would need its own copy and wipe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cloister/api/v1/api.pb.h"
#include "google/protobuf/message_lite.h"

namespace cloister::proto {

// Serializes `message` into `buffer`, followed by room for the AEAD tag, and returns the whole
// buffer as the span to seal in place. InvalidArgument when the message and its tag would be
// over the 2 GiB a protobuf message can carry (`buffer` is then left alone).
absl::StatusOr<std::span<uint8_t>> SerializeForSealing(const google::protobuf::MessageLite& message,
                                                       std::string& buffer);

// The same for the InferRequestPayload of `inputs` and `outputs`, byte for byte what that
// message would serialize to, but written straight from the caller's tensors: no payload
// message holds a copy of their bytes (which would be one more copy of the plaintext to make
// and to wipe).
absl::StatusOr<std::span<uint8_t>> SerializeInferRequestForSealing(
    const std::vector<api::v1::Tensor>& inputs, const std::vector<std::string>& outputs,
    std::string& buffer);

}  // namespace cloister::proto
