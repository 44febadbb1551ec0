// The tokenizer's shared helpers: UTF-8 (validation, lossy decoding, JavaScript's trim),
// tokenizer.json access that names the key path in every error, patterns (a literal or a
// PCRE2 regex matched like JavaScript's /gu) and GPT-2's byte-level map.
#include <utf8proc.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers.

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t code_point;
    utf8proc_ssize_t length =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                         static_cast<utf8proc_ssize_t>(text.size() - i), &code_point);
    if (length <= 0) return false;
    i += static_cast<size_t>(length);
  }
  return true;
}

char32_t NextCodePoint(std::string_view text, size_t& i) {
  utf8proc_int32_t code_point = 0;
  utf8proc_ssize_t length =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                       static_cast<utf8proc_ssize_t>(text.size() - i), &code_point);
  if (length <= 0) {  // not reached for validated text; step one byte to stay finite
    ++i;
    return 0xFFFD;
  }
  i += static_cast<size_t>(length);
  return static_cast<char32_t>(code_point);
}

void AppendCodePoint(char32_t code_point, std::string& out) {
  utf8proc_uint8_t buffer[4];
  utf8proc_ssize_t length = utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), buffer);
  out.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

void AppendLossyUtf8(std::string_view bytes, std::string& out) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const unsigned char lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    size_t needed = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      needed = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      needed = 2;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      needed = 3;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      out.append(kReplacementCharacter);
      ++i;
      continue;
    }
    size_t j = i + 1;
    size_t seen = 0;
    while (seen < needed && j < n) {
      const unsigned char next = static_cast<unsigned char>(bytes[j]);
      if (next < low || next > high) break;
      low = 0x80;
      high = 0xBF;
      ++j;
      ++seen;
    }
    if (seen == needed) {
      out.append(bytes.substr(i, j - i));
    } else {
      out.append(kReplacementCharacter);
    }
    i = j;
  }
}

bool IsJsWhitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view TrimStartJs(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t next = i;
    if (!IsJsWhitespace(NextCodePoint(text, next))) break;
    i = next;
  }
  return text.substr(i);
}

std::string_view TrimEndJs(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!IsJsWhitespace(NextCodePoint(text, probe))) break;
    end = start;
  }
  return text.substr(0, end);
}

bool IsWordCharacter(char32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// JSON helpers.

absl::Status Invalid(std::string_view file, std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Cat(file, ": ", path, " ", what));
}

absl::Status CheckJsonDepth(std::string_view text, std::string_view file) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(
            Cat(file, ": JSON nesting deeper than ", kMaxJsonDepth, " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view file, size_t max_size) {
  if (text.size() > max_size) {
    return absl::InvalidArgumentError(
        Cat(file, ": ", text.size(), " bytes is over the limit of ", max_size));
  }
  RETURN_IF_ERROR(CheckJsonDepth(text, file));
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(Cat(file, ": invalid JSON: ", e.what()));
  }
}

const Json* Find(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const Json& object, std::string_view key, std::string_view path,
                             bool fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return Invalid("tokenizer.json", Cat(path, ".", key), "must be a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::string> GetString(const Json& object, std::string_view key,
                                      std::string_view path, std::optional<std::string> fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) {
    if (fallback.has_value()) return *fallback;
    return Invalid("tokenizer.json", Cat(path, ".", key), "is missing");
  }
  if (!value->is_string()) {
    return Invalid("tokenizer.json", Cat(path, ".", key), "must be a string");
  }
  return value->get<std::string>();
}

absl::StatusOr<std::string> GetType(const Json& component, std::string_view path) {
  if (!component.is_object()) return Invalid("tokenizer.json", path, "must be an object");
  return GetString(component, "type", path, std::nullopt);
}

absl::Status Unsupported(std::string_view path, std::string_view type) {
  return Invalid("tokenizer.json", Cat(path, ".type"),
                 Cat("\"", type, "\" is not supported"));
}

// ---------------------------------------------------------------------------------------------
// Patterns.

absl::StatusOr<Pattern> Pattern::Regex(std::string_view source, std::string_view path) {
  if (source.size() > kMaxPatternSize) {
    return Invalid("tokenizer.json", path, Cat("is longer than ", kMaxPatternSize, " bytes"));
  }
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return Invalid("tokenizer.json", path,
                   Cat("is not a valid regex at offset ", error_offset, ": ",
                                reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter also works
  Pattern pattern;
  pattern.regex_ = std::shared_ptr<pcre2_code>(code, CodeDeleter());
  return pattern;
}

absl::StatusOr<Pattern> Pattern::Literal(std::string literal, std::string_view path) {
  if (literal.empty()) return Invalid("tokenizer.json", path, "must not be empty");
  Pattern pattern;
  pattern.literal_ = std::move(literal);
  return pattern;
}

absl::StatusOr<Pattern> Pattern::FromJson(const Json& json, std::string_view path) {
  if (const Json* literal = Find(json, "String"); literal != nullptr && literal->is_string()) {
    return Literal(literal->get<std::string>(), Cat(path, ".String"));
  }
  if (const Json* regex = Find(json, "Regex"); regex != nullptr && regex->is_string()) {
    return Regex(regex->get<std::string>(), Cat(path, ".Regex"));
  }
  return Invalid("tokenizer.json", path, "must be {\"String\": ...} or {\"Regex\": ...}");
}

absl::Status Pattern::FindAll(std::string_view text,
                              std::vector<std::pair<size_t, size_t>>& matches) const {
  matches.clear();
  if (!regex_) {
    size_t at = 0;
    while ((at = text.find(literal_, at)) != std::string_view::npos) {
      matches.emplace_back(at, at + literal_.size());
      at += literal_.size();
    }
    return absl::OkStatus();
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(regex_.get(), nullptr), &pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(
      pcre2_match_context_create(nullptr), &pcre2_match_context_free);
  if (!data || !context) return absl::ResourceExhaustedError("tokenizer: out of memory for a regex match");
  pcre2_set_match_limit(context.get(), kRegexMatchLimit);
  pcre2_set_depth_limit(context.get(), kRegexDepthLimit);
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(regex_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                         start, PCRE2_NO_UTF_CHECK, data.get(), context.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          "tokenizer: a pre-tokenizer regex exceeded its match limit on this text");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    size_t begin = ovector[0], end = ovector[1];
    if (end < begin) end = begin;  // \K tricks; keep the range sane
    matches.emplace_back(begin, end);
    if (end > begin) {
      start = end;
    } else {
      if (begin >= text.size()) break;
      start = begin + Utf8Length(static_cast<unsigned char>(text[begin]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pattern::ReplaceAll(std::string_view text,
                                                std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  RETURN_IF_ERROR(FindAll(text, matches));
  std::string out;
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text.substr(previous, begin - previous));
    out.append(content);
    previous = end;
  }
  out.append(text.substr(previous));
  return out;
}

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

}  // namespace cloister::llm::tokenizer_internal
