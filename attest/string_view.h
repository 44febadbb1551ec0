// Internal to attest/: Debian's abseil is built with its own absl::string_view (not an alias
// of std::string_view), while our public headers use std::string_view like base/. These two
// helpers convert at the boundary without copying. Thread-safe: pure functions.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace cloister::attest {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view StdSv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace cloister::attest
