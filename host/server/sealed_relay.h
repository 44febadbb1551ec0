// The tenant API's sealed messages and the boundary's sealed items, converted both ways for the
// service and its reactors (host/server/cloister_service.h). The host never opens them: only the
// ids, sequence and ciphertext are carried over. Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::host {

// The longest session id a tenant may name (the enclave's are shorter).
inline constexpr size_t kMaxSessionIdSize = 64;

// The boundary item for `call`, carrying `ciphertext` (the call's, copied or moved in).
boundary::v1::ForwardedRequest ToForwardedRequest(const api::v1::SealedRequest& call, std::string ciphertext);

// Moves the sealed reply for `request_id` into `response`, or returns the host-visible error the
// enclave reported for it (INTERNAL when it replied for another request).
absl::Status ToSealedReply(boundary::v1::EnclaveReply& item, absl::string_view request_id,
                           api::v1::SealedReply& response);

}  // namespace cloister::host
