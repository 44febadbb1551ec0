// Debian's abseil is built with its own absl::string_view (not an alias of std::string_view),
// while base/ takes std::string_view. Host code uses absl::string_view with absl and converts at
// the base/ boundary with ToStd(). Thread-safe: a pure function.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace cloister::host {

inline std::string_view ToStd(absl::string_view text) { return {text.data(), text.size()}; }

}  // namespace cloister::host
