// Enclave measurements in simulation: the SHA-384 of the cloister-enclave executable
// (DESIGN.md section 4), so a changed binary fails a policy that pinned the old one.
// Thread-safe: pure function.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

// SHA-384 of the file's contents, read in chunks (48 bytes). NotFound or PermissionDenied
// when it cannot be opened; InvalidArgument when it is not a regular file.
absl::StatusOr<Bytes> MeasureFile(const std::string& path);

}  // namespace cloister::attest
