#include "attest/nvidia/base64.h"

#include "absl/strings/str_cat.h"

namespace cloister::attest {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int DigitValue(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool IsWhitespace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

std::string Base64Encode(ByteSpan data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    uint32_t group = uint32_t{data[i]} << 16 | uint32_t{data[i + 1]} << 8 | data[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(group >> shift) & 63]);
  }
  size_t rest = data.size() - i;
  if (rest > 0) {
    uint32_t group = uint32_t{data[i]} << 16 | (rest == 2 ? uint32_t{data[i + 1]} << 8 : 0);
    out.push_back(kAlphabet[(group >> 18) & 63]);
    out.push_back(kAlphabet[(group >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(group >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

absl::StatusOr<Bytes> Base64Decode(std::string_view text, bool skip_whitespace) {
  std::string digits;
  digits.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (IsWhitespace(text[i])) {
      if (!skip_whitespace) {
        return absl::InvalidArgumentError(absl::StrCat("base64: whitespace at offset ", i));
      }
      continue;
    }
    digits.push_back(text[i]);
  }
  if (digits.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("base64: ", digits.size(), " characters, not a multiple of 4"));
  }
  Bytes out;
  out.reserve(digits.size() / 4 * 3);
  for (size_t i = 0; i < digits.size(); i += 4) {
    // Only the last group may end in "=" or "==".
    size_t padding = 0;
    if (i + 4 == digits.size() && digits[i + 3] == '=') padding = digits[i + 2] == '=' ? 2 : 1;
    uint32_t group = 0;
    for (size_t j = 0; j < 4 - padding; ++j) {
      int value = DigitValue(digits[i + j]);
      if (value < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "base64: bad character '", std::string(1, digits[i + j]), "' at digit ", i + j));
      }
      group = group << 6 | static_cast<uint32_t>(value);
    }
    group <<= 6 * padding;
    out.push_back(static_cast<uint8_t>(group >> 16));
    if (padding < 2) out.push_back(static_cast<uint8_t>(group >> 8));
    if (padding < 1) out.push_back(static_cast<uint8_t>(group));
    // Canonical form: the bits that padding leaves unused must be zero.
    if ((padding == 1 && (group & 0xFF) != 0) || (padding == 2 && (group & 0xFFFF) != 0)) {
      return absl::InvalidArgumentError("base64: non-zero bits in the padding");
    }
  }
  return out;
}

}  // namespace cloister::attest
