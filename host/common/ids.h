// Syntax checks for the identifiers cloisterd accepts from tenants and operators. They are used
// as map keys, log fields and path components (models/<tenant>/<handle>.blob), so each check is
// strict enough that a valid value is always a safe single path component.
// Thread-safe: pure functions.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cloister::host {

inline constexpr size_t kMaxTenantIdSize = 64;
inline constexpr size_t kModelHandleSize = 32;
inline constexpr size_t kMaxRequestIdSize = 128;

// A tenant id: 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or digit.
bool IsValidTenantId(absl::string_view tenant_id);
// A model handle: exactly 32 lowercase hex digits (PROTOCOL.md section 4).
bool IsValidModelHandle(absl::string_view handle);

// InvalidArgument with a message naming what is wrong, OK otherwise.
absl::Status CheckTenantId(absl::string_view tenant_id);
absl::Status CheckModelHandle(absl::string_view handle);
// A request id: 1 to 128 printable ASCII characters (no spaces or control characters).
absl::Status CheckRequestId(absl::string_view request_id);

}  // namespace cloister::host
