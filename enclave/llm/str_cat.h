// Cat: absl::StrCat over arguments that may be std::string_view. Debian's abseil has a
// string_view type of its own, which StrCat's AlphaNum takes and std::string_view does not
// convert to; Cat converts such arguments first.
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace cloister::llm {
namespace str_cat_internal {

template <typename T>
decltype(auto) ForCat(const T& value) {
  if constexpr (std::is_convertible_v<const T&, std::string_view> &&
                !std::is_convertible_v<const T&, absl::string_view>) {
    std::string_view view = value;
    return absl::string_view(view.data(), view.size());
  } else {
    return (value);
  }
}

}  // namespace str_cat_internal

template <typename... T>
std::string Cat(const T&... values) {
  return absl::StrCat(str_cat_internal::ForCat(values)...);
}

}  // namespace cloister::llm
