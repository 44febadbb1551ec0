// File helpers used by every program: whole-file reads with a size cap and atomic writes
// (temp file, fsync, rename) so a crash never leaves a half-written file behind.
// Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister {

inline constexpr uint64_t kDefaultMaxFileSize = uint64_t{1} << 30;

// Reads a whole file; NotFound if missing, InvalidArgument if larger than `max_size`.
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     uint64_t max_size = kDefaultMaxFileSize);
// Writes `data` to `path` atomically with the given permission bits.
absl::Status WriteFileAtomic(const std::string& path, std::string_view data, int mode = 0600);
absl::Status MakeDirs(const std::string& path, int mode = 0700);
bool FileExists(const std::string& path);

}  // namespace cloister
