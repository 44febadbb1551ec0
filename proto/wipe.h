// WipeMessage: overwrites, in place, every string and bytes value a protobuf message holds
// (recursively through sub-messages, repeated fields, maps and unknown fields) before the
// message is freed, so that a tenant's plaintext parsed into or built as a message does not
// linger in freed heap memory. The message keeps its shape (sizes, field presence); its
// contents become zero bytes. Numeric fields are left as they are.
//
// Thread-compatible: the caller must own `message`. Works on any generated message with
// descriptors (full runtime, not lite), including ONNX's ModelProto.
#pragma once

#include <string>

#include "google/protobuf/message.h"

namespace cloister::proto {

void WipeMessage(google::protobuf::Message& message);

// Overwrites a serialized copy (a std::string's bytes, up to its size) in place.
void WipeString(std::string& bytes);

}  // namespace cloister::proto
