#include "base/bytes.h"

#include "absl/strings/str_cat.h"

namespace cloister {

std::string HexEncode(ByteSpan data) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(data.size() * 2);
  for (uint8_t b : data) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

absl::StatusOr<Bytes> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hex text has odd length ", hex.size()));
  }
  Bytes out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexValue(hex[2 * i]);
    int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("non-hex character at offset ", 2 * i));
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

void AppendBigEndian(Bytes& out, uint64_t value, int width) {
  for (int i = width - 1; i >= 0; --i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void AppendLengthPrefixed(Bytes& out, ByteSpan data) {
  AppendBigEndian(out, data.size(), 4);
  Append(out, data);
}

bool ConstantTimeEquals(ByteSpan a, ByteSpan b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace cloister
