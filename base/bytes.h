// Byte-string helpers: the Bytes alias, hex coding, big-endian integer codecs and
// constant-time comparison. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister {

using Bytes = std::vector<uint8_t>;
using ByteSpan = std::span<const uint8_t>;

inline ByteSpan AsBytes(std::string_view s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
inline Bytes ToBytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
// (From pointer and size: a copy of one memcpy, not a loop converting byte by byte.)
inline std::string ToString(ByteSpan b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string HexEncode(ByteSpan data);
// Decodes hex text (either case, no separators); an odd length or a non-hex digit is an
// InvalidArgument error.
absl::StatusOr<Bytes> HexDecode(std::string_view hex);

// Appends `value` as a `width`-byte big-endian integer.
void AppendBigEndian(Bytes& out, uint64_t value, int width);
// Appends a 4-byte big-endian length followed by the bytes (unambiguous concatenation).
void AppendLengthPrefixed(Bytes& out, ByteSpan data);
inline void Append(Bytes& out, ByteSpan data) { out.insert(out.end(), data.begin(), data.end()); }

// Constant-time equality for secrets and MACs; different lengths compare unequal.
bool ConstantTimeEquals(ByteSpan a, ByteSpan b);

}  // namespace cloister
