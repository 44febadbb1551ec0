// Base64 (RFC 4648, standard alphabet, '=' padding) for the NVIDIA evidence formats: the
// certificates inside RIM XML signatures and the fields of NVIDIA's evidence JSON. Decoding is
// strict: the length must be a multiple of 4, padding only at the end, and the unused bits of
// the last character must be zero, so every byte string has exactly one accepted encoding.
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

std::string Base64Encode(ByteSpan data);

// Decodes `text`; InvalidArgument naming the offset of the first bad character. Whitespace is
// refused unless `skip_whitespace` (PEM-style line breaks inside XML elements).
absl::StatusOr<Bytes> Base64Decode(std::string_view text, bool skip_whitespace = false);

}  // namespace cloister::attest
