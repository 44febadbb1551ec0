// The model handle the host sees (docs/PROTOCOL.md section 4): 32 hex characters derived from
// the owner's identity key and the model name, stable for that pair and revealing neither.
// Thread-safe: a pure function.
#pragma once

#include <string>
#include <string_view>

#include "base/bytes.h"

namespace cloister::crypto {

std::string ModelHandle(ByteSpan owner_identity_public_key, std::string_view model_name);

// The handle of the operator-published model `model_name`: the same for every tenant, and never
// equal to a tenant model's handle (another domain label).
std::string PublishedModelHandle(std::string_view model_name);

// True for 32 lowercase hex characters.
bool IsValidModelHandle(std::string_view handle);

// The chunked-encryption context for a model upload: "cloister/v1 model" || handle.
Bytes ModelEncryptionContext(std::string_view handle);

}  // namespace cloister::crypto
