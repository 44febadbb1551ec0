#include "enclave/llm/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

using Json = nlohmann::json;


// Limits on tenant input. Real tokenizer.json files are up to ~20 MB, vocabularies up to ~260k.
constexpr size_t kMaxTokenizerJsonSize = 48u << 20;
constexpr size_t kMaxConfigJsonSize = 4u << 20;
constexpr int kMaxJsonDepth = 64;
constexpr int32_t kMaxVocabularySize = 1 << 21;
constexpr size_t kMaxTokenSize = 4096;
constexpr size_t kMaxPatternSize = 8192;
constexpr int kMaxComponentDepth = 16;
constexpr size_t kMaxAddedTokens = 1 << 16;
// PCRE2 backtracking bound per match call, so a hostile pattern cannot hang Encode.
constexpr uint32_t kRegexMatchLimit = 10'000'000;
constexpr uint32_t kRegexDepthLimit = 10'000;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers.

// Length of the UTF-8 sequence starting at text[i], assuming text is valid UTF-8.
size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

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

// Decodes the code point at text[i] (valid UTF-8) and advances i.
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

// Appends bytes as UTF-8, replacing each maximal ill-formed subpart with U+FFFD (the WHATWG
// TextDecoder and Rust from_utf8_lossy rule).
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

// JavaScript's String.prototype.trim whitespace (WhiteSpace and LineTerminator).
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
// JSON helpers: every error names the key path in the file.

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

absl::Status Invalid(std::string_view file, std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Cat(file, ": ", path, " ", what));
}

// Rejects nesting deeper than kMaxJsonDepth before the parser sees it.
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
// Patterns: a literal string or a PCRE2 regex (UTF + UCP), matched globally like a JavaScript
// /gu regex (after an empty match the search resumes one code point later).

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};

class Pattern {
 public:
  static absl::StatusOr<Pattern> Regex(std::string_view source, std::string_view path) {
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

  static absl::StatusOr<Pattern> Literal(std::string literal, std::string_view path) {
    if (literal.empty()) return Invalid("tokenizer.json", path, "must not be empty");
    Pattern pattern;
    pattern.literal_ = std::move(literal);
    return pattern;
  }

  // Parses {"String": "..."} or {"Regex": "..."}.
  static absl::StatusOr<Pattern> FromJson(const Json& json, std::string_view path) {
    if (const Json* literal = Find(json, "String"); literal != nullptr && literal->is_string()) {
      return Literal(literal->get<std::string>(), Cat(path, ".String"));
    }
    if (const Json* regex = Find(json, "Regex"); regex != nullptr && regex->is_string()) {
      return Regex(regex->get<std::string>(), Cat(path, ".Regex"));
    }
    return Invalid("tokenizer.json", path, "must be {\"String\": ...} or {\"Regex\": ...}");
  }

  // Non-overlapping matches as [begin, end) byte ranges, empty matches included.
  absl::Status FindAll(std::string_view text,
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

  // JavaScript replaceAll with a plain replacement string.
  absl::StatusOr<std::string> ReplaceAll(std::string_view text, std::string_view content) const {
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

 private:
  std::string literal_;
  std::shared_ptr<pcre2_code> regex_;
};

// The GPT-2 pre-tokenizer regex that ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// GPT-2's byte <-> printable code point map used by the ByteLevel components.
struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_code_point{};
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<char32_t, uint8_t> code_point_to_byte;
  ByteLevelTables() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t code_point = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      byte_to_code_point[b] = code_point;
      AppendCodePoint(code_point, byte_to_utf8[b]);
      code_point_to_byte[code_point] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

// ---------------------------------------------------------------------------------------------
// Normalizers.

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string& text) const = 0;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(std::string& text) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  absl::Status Normalize(std::string& text) const override {
    if (text.empty()) return absl::OkStatus();
    utf8proc_uint8_t* result = nullptr;
    utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     static_cast<utf8proc_ssize_t>(text.size()), &result,
                     static_cast<utf8proc_option_t>(options_ | UTF8PROC_STABLE));
    if (length < 0) {
      return absl::InvalidArgumentError(
          Cat("tokenizer: unicode normalization failed: ", utf8proc_errmsg(length)));
    }
    text.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
    std::free(result);
    return absl::OkStatus();
  }

 private:
  int options_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string& text) const override {
    text.insert(0, prefix_);
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string& text) const override {
    ASSIGN_OR_RETURN(text, pattern_.ReplaceAll(text, content_));
    return absl::OkStatus();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      AppendCodePoint(static_cast<char32_t>(utf8proc_tolower(
                          static_cast<utf8proc_int32_t>(NextCodePoint(text, i)))),
                      out);
    }
    text = std::move(out);
    return absl::OkStatus();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string& text) const override {
    std::string_view view = text;
    if (left_) view = TrimStartJs(view);
    if (right_) view = TrimEndJs(view);
    text = std::string(view);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& json, std::string path,
                                                           int depth) {
  if (depth > kMaxComponentDepth) return Invalid("tokenizer.json", path, "is nested too deeply");
  ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = Find(json, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return Invalid("tokenizer.json", path + ".normalizers", "must be an array");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto part, MakeNormalizer((*list)[i], Cat(path, ".normalizers[", i, "]"), depth + 1));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, GetString(json, "prepend", path, std::nullopt));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    const Json* pattern_json = Find(json, "pattern");
    if (pattern_json == nullptr) return Invalid("tokenizer.json", path + ".pattern", "is missing");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, path + ".pattern"));
    ASSIGN_OR_RETURN(std::string content, GetString(json, "content", path, ""));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(bool left, GetBool(json, "strip_left", path, false));
    ASSIGN_OR_RETURN(bool right, GetBool(json, "strip_right", path, false));
    return std::make_unique<StripNormalizer>(left, right);
  }
  return Unsupported(path, type);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: each maps every piece to zero or more pieces, in order.

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // section_index: index of the added-token section the text came from (Metaspace "first").
  virtual absl::Status PreTokenize(std::vector<std::string>& pieces, size_t section_index) const = 0;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(std::vector<std::string>& pieces, size_t section_index) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->PreTokenize(pieces, section_index));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status PreTokenize(std::vector<std::string>& pieces, size_t) const override {
    const ByteLevelTables& tables = ByteLevel();
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> matches;
    auto encode = [&](std::string_view piece) {
      std::string mapped;
      mapped.reserve(piece.size() * 2);
      for (unsigned char byte : piece) mapped.append(tables.byte_to_utf8[byte]);
      out.push_back(std::move(mapped));
    };
    for (std::string& piece : pieces) {
      if (add_prefix_space_ && !std::string_view(piece).starts_with(" ")) piece.insert(0, " ");
      if (!regex_.has_value()) {
        encode(piece);
        continue;
      }
      RETURN_IF_ERROR(regex_->FindAll(piece, matches));
      for (const auto& [begin, end] : matches) {
        if (end > begin) encode(std::string_view(piece).substr(begin, end - begin));
      }
    }
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> regex_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  enum class Behavior { kIsolated, kRemoved, kMatchesOnly };
  SplitPreTokenizer(Pattern pattern, Behavior behavior)
      : pattern_(std::move(pattern)), behavior_(behavior) {}
  absl::Status PreTokenize(std::vector<std::string>& pieces, size_t) const override {
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> matches;
    for (const std::string& piece : pieces) {
      RETURN_IF_ERROR(pattern_.FindAll(piece, matches));
      std::string_view text = piece;
      size_t previous = 0;
      for (const auto& [begin, end] : matches) {
        if (behavior_ != Behavior::kMatchesOnly && begin > previous) {
          out.emplace_back(text.substr(previous, begin - previous));
        }
        if (behavior_ != Behavior::kRemoved && end > begin) {
          out.emplace_back(text.substr(begin, end - begin));
        }
        previous = end;
      }
      if (behavior_ != Behavior::kMatchesOnly && previous < text.size()) {
        out.emplace_back(text.substr(previous));
      }
    }
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
};

// Runs of ASCII digits (one piece per digit when individual) and runs of everything else, as
// transformers.js's /[^\d]+|\d+/gu does.
class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  absl::Status PreTokenize(std::vector<std::string>& pieces, size_t) const override {
    std::vector<std::string> out;
    for (const std::string& piece : pieces) {
      size_t i = 0;
      while (i < piece.size()) {
        const bool digit = piece[i] >= '0' && piece[i] <= '9';
        size_t j = i + 1;
        if (!digit || !individual_) {
          while (j < piece.size() && (piece[j] >= '0' && piece[j] <= '9') == digit) ++j;
        }
        out.push_back(piece.substr(i, j - i));
        i = j;
      }
    }
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  bool individual_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  absl::Status PreTokenize(std::vector<std::string>& pieces, size_t section_index) const override {
    std::vector<std::string> out;
    for (const std::string& piece : pieces) {
      std::string text;
      for (char c : piece) {
        if (c == ' ') {
          text.append(replacement_);
        } else {
          text.push_back(c);
        }
      }
      if (!std::string_view(text).starts_with(replacement_) &&
          (scheme_ == PrependScheme::kAlways ||
           (scheme_ == PrependScheme::kFirst && section_index == 0))) {
        text.insert(0, replacement_);
      }
      if (!split_) {
        out.push_back(std::move(text));
        continue;
      }
      // Split before every replacement character (the Rust library's MergedWithNext).
      size_t start = 0;
      size_t at = text.find(replacement_, 1);
      while (at != std::string::npos) {
        out.push_back(text.substr(start, at - start));
        start = at;
        at = text.find(replacement_, at + replacement_.size());
      }
      if (start < text.size()) out.push_back(text.substr(start));
    }
    pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

absl::StatusOr<PrependScheme> GetPrependScheme(const Json& json, std::string_view path) {
  const Json* scheme = Find(json, "prepend_scheme");
  if (scheme == nullptr) {
    ASSIGN_OR_RETURN(bool add_prefix_space, GetBool(json, "add_prefix_space", path, true));
    return add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  if (*scheme == "always") return PrependScheme::kAlways;
  if (*scheme == "first") return PrependScheme::kFirst;
  if (*scheme == "never") return PrependScheme::kNever;
  return Invalid("tokenizer.json", Cat(path, ".prepend_scheme"),
                 "must be \"always\", \"first\" or \"never\"");
}

absl::StatusOr<std::string> GetReplacement(const Json& json, std::string_view path) {
  ASSIGN_OR_RETURN(std::string replacement, GetString(json, "replacement", path, "\xE2\x96\x81"));
  if (replacement.empty()) {
    return Invalid("tokenizer.json", Cat(path, ".replacement"), "must not be empty");
  }
  return replacement;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& json, std::string path,
                                                               int depth) {
  if (depth > kMaxComponentDepth) return Invalid("tokenizer.json", path, "is nested too deeply");
  ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = Find(json, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return Invalid("tokenizer.json", path + ".pretokenizers", "must be an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto part, MakePreTokenizer((*list)[i], Cat(path, ".pretokenizers[", i, "]"), depth + 1));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space, GetBool(json, "add_prefix_space", path, false));
    ASSIGN_OR_RETURN(bool use_regex, GetBool(json, "use_regex", path, true));
    std::optional<Pattern> regex;
    if (use_regex) {
      ASSIGN_OR_RETURN(regex, Pattern::Regex(kGpt2Regex, path));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Split") {
    const Json* pattern_json = Find(json, "pattern");
    if (pattern_json == nullptr) return Invalid("tokenizer.json", path + ".pattern", "is missing");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, path + ".pattern"));
    ASSIGN_OR_RETURN(bool invert, GetBool(json, "invert", path, false));
    ASSIGN_OR_RETURN(std::string behavior, GetString(json, "behavior", path, "Isolated"));
    SplitPreTokenizer::Behavior mode;
    if (invert) {
      mode = SplitPreTokenizer::Behavior::kMatchesOnly;
    } else if (behavior == "Isolated") {
      mode = SplitPreTokenizer::Behavior::kIsolated;
    } else if (behavior == "Removed") {
      mode = SplitPreTokenizer::Behavior::kRemoved;
    } else {
      return Invalid("tokenizer.json", path + ".behavior",
                     Cat("\"", behavior, "\" is not supported"));
    }
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), mode);
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(bool individual, GetBool(json, "individual_digits", path, false));
    return std::make_unique<DigitsPreTokenizer>(individual);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement, GetReplacement(json, path));
    ASSIGN_OR_RETURN(PrependScheme scheme, GetPrependScheme(json, path));
    ASSIGN_OR_RETURN(bool split, GetBool(json, "split", path, false));
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
  }
  return Unsupported(path, type);
}

// ---------------------------------------------------------------------------------------------
// Decoders: each rewrites the list of token strings, then the pieces are joined.

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& part : parts_) part->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Maps byte-level code points back to bytes; added tokens pass through verbatim and cut the
// byte runs (as transformers.js does).
class ByteLevelDecoder : public Decoder {
 public:
  explicit ByteLevelDecoder(const std::unordered_set<std::string>* added_contents)
      : added_contents_(added_contents) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    const ByteLevelTables& tables = ByteLevel();
    std::vector<std::string> out;
    std::string bytes;
    bool have_run = false;
    auto flush = [&] {
      if (!have_run) return;
      std::string text;
      AppendLossyUtf8(bytes, text);
      out.push_back(std::move(text));
      bytes.clear();
      have_run = false;
    };
    for (const std::string& token : tokens) {
      if (added_contents_->count(token) > 0) {
        flush();
        out.push_back(token);
        continue;
      }
      have_run = true;
      for (size_t i = 0; i < token.size();) {
        size_t start = i;
        char32_t code_point = NextCodePoint(token, i);
        auto it = tables.code_point_to_byte.find(code_point);
        if (it != tables.code_point_to_byte.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(token, start, i - start);
        }
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  const std::unordered_set<std::string>* added_contents_;  // owned by Parts
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string text;
      const std::string& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          text.push_back(' ');
          at += replacement_.size();
        } else {
          text.push_back(token[at++]);
        }
      }
      if (i == 0 && strip_first_ && std::string_view(text).starts_with(" ")) text.erase(0, 1);
      tokens[i] = std::move(text);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      absl::StatusOr<std::string> replaced = pattern_.ReplaceAll(token, content_);
      if (replaced.ok()) token = *std::move(replaced);  // a regex over its limit leaves the token
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Turns runs of <0xNN> tokens into text (ill-formed UTF-8 as U+FFFD).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      std::string text;
      AppendLossyUtf8(bytes, text);
      out.push_back(std::move(text));
      bytes.clear();
    };
    for (std::string& token : tokens) {
      std::optional<uint8_t> byte = ParseByteToken(token);
      if (byte.has_value()) {
        bytes.push_back(static_cast<char>(*byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }

  static std::optional<uint8_t> ParseByteToken(std::string_view token) {
    if (token.size() != 6 || !std::string_view(token).starts_with("<0x") || token[5] != '>') return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int high = hex(token[3]), low = hex(token[4]);
    if (high < 0 || low < 0) return std::nullopt;
    return static_cast<uint8_t>(high * 16 + low);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string joined = absl::StrJoin(tokens, "");
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (std::string& token : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0; ++i) {
        begin += content_.size();
      }
      size_t end = token.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

struct DecoderInfo {
  bool has_byte_fallback = false;
};

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(
    const Json& json, std::string path, int depth,
    const std::unordered_set<std::string>* added_contents, DecoderInfo& info) {
  if (depth > kMaxComponentDepth) return Invalid("tokenizer.json", path, "is nested too deeply");
  ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = Find(json, "decoders");
    if (list == nullptr || !list->is_array()) {
      return Invalid("tokenizer.json", path + ".decoders", "must be an array");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto part, MakeDecoder((*list)[i], Cat(path, ".decoders[", i, "]"),
                                              depth + 1, added_contents, info));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>(added_contents);
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement, GetReplacement(json, path));
    ASSIGN_OR_RETURN(PrependScheme scheme, GetPrependScheme(json, path));
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), scheme != PrependScheme::kNever);
  }
  if (type == "Replace") {
    const Json* pattern_json = Find(json, "pattern");
    if (pattern_json == nullptr) return Invalid("tokenizer.json", path + ".pattern", "is missing");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, path + ".pattern"));
    ASSIGN_OR_RETURN(std::string content, GetString(json, "content", path, ""));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "ByteFallback") {
    info.has_byte_fallback = true;
    return std::make_unique<ByteFallbackDecoder>();
  }
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string content, GetString(json, "content", path, " "));
    auto count = [&](std::string_view key) -> absl::StatusOr<size_t> {
      const Json* value = Find(json, key);
      if (value == nullptr) return 0;
      if (!value->is_number_unsigned() || value->get<uint64_t>() > 1024) {
        return Invalid("tokenizer.json", Cat(path, ".", key), "must be an integer in [0, 1024]");
      }
      return value->get<size_t>();
    };
    ASSIGN_OR_RETURN(size_t start, count("start"));
    ASSIGN_OR_RETURN(size_t stop, count("stop"));
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  return Unsupported(path, type);
}

// ---------------------------------------------------------------------------------------------
// Added tokens.

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Finds added tokens in text: leftmost, then longest; a single_word token only matches between
// non-word characters.
class AddedTokenMatcher {
 public:
  void Add(std::string pattern, size_t token_index) {
    if (pattern.empty()) return;
    entries_.push_back({std::move(pattern), token_index});
  }
  void Finish() {
    std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      if (a.pattern[0] != b.pattern[0]) {
        return static_cast<unsigned char>(a.pattern[0]) < static_cast<unsigned char>(b.pattern[0]);
      }
      return a.pattern.size() > b.pattern.size();
    });
    first_.fill({0, 0});
    for (size_t i = 0; i < entries_.size(); ++i) {
      auto& range = first_[static_cast<unsigned char>(entries_[i].pattern[0])];
      if (range.second == 0) range.first = i;
      range.second = i + 1;
    }
  }
  bool empty() const { return entries_.empty(); }

  struct Section {
    std::string text;
    std::optional<size_t> token;  // index into the added tokens
  };
  // Splits text into plain sections and added-token sections.
  std::vector<Section> Split(std::string_view text, const std::vector<AddedToken>& tokens) const {
    std::vector<Section> sections;
    size_t plain_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      const auto [begin, end] = first_[static_cast<unsigned char>(text[i])];
      const Entry* match = nullptr;
      for (size_t e = begin; e < end; ++e) {
        const Entry& entry = entries_[e];
        if (text.compare(i, entry.pattern.size(), entry.pattern) != 0) continue;
        if (tokens[entry.token].single_word && !IsWholeWord(text, i, i + entry.pattern.size())) {
          continue;
        }
        match = &entry;
        break;
      }
      if (match == nullptr) {
        ++i;
        continue;
      }
      if (i > plain_start) sections.push_back({std::string(text.substr(plain_start, i - plain_start)), std::nullopt});
      sections.push_back({match->pattern, match->token});
      i += match->pattern.size();
      plain_start = i;
    }
    if (plain_start < text.size()) sections.push_back({std::string(text.substr(plain_start)), std::nullopt});
    return sections;
  }

 private:
  struct Entry {
    std::string pattern;
    size_t token;
  };
  static bool IsWholeWord(std::string_view text, size_t begin, size_t end) {
    if (begin > 0) {
      size_t start = begin - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      if (IsWordCharacter(NextCodePoint(text, start))) return false;
    }
    if (end < text.size()) {
      size_t at = end;
      if (IsWordCharacter(NextCodePoint(text, at))) return false;
    }
    return true;
  }
  std::vector<Entry> entries_;
  std::array<std::pair<size_t, size_t>, 256> first_{};
};

// Applies lstrip / rstrip of added-token sections to their neighbours.
void StripAroundAddedTokens(std::vector<AddedTokenMatcher::Section>& sections,
                            const std::vector<AddedToken>& tokens) {
  for (size_t i = 0; i < sections.size(); ++i) {
    if (!sections[i].token.has_value()) continue;
    const AddedToken& token = tokens[*sections[i].token];
    if (token.lstrip && i > 0 && !sections[i - 1].token.has_value()) {
      sections[i - 1].text = std::string(TrimEndJs(sections[i - 1].text));
    }
    if (token.rstrip && i + 1 < sections.size() && !sections[i + 1].token.has_value()) {
      sections[i + 1].text = std::string(TrimStartJs(sections[i + 1].text));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// BPE.

struct MergeValue {
  int32_t rank;
  int32_t merged;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct Tokenizer::Parts {
  // Ids and contents, added tokens overriding the model's entries (as transformers.js does).
  std::vector<std::string> id_to_token;
  std::vector<uint8_t> id_present;
  std::vector<uint8_t> id_special;
  std::vector<uint8_t> id_byte_token;  // a <0xNN> token (only tracked with ByteFallback decoding)
  TokenMap token_to_id;

  // The BPE model.
  TokenMap model_vocab;
  std::unordered_map<uint64_t, MergeValue> merges;
  std::optional<int32_t> unk_id;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_token_ids{};
  // Model ids whose content an added token with another id took over -> that added id.
  std::unordered_map<int32_t, int32_t> overridden_ids;

  std::vector<AddedToken> added_tokens;
  TokenMap added_by_content;  // content and normalized content -> index into added_tokens
  std::unordered_set<std::string> added_contents;
  AddedTokenMatcher raw_matcher;
  AddedTokenMatcher normalized_matcher;

  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  bool has_post_processor = false;
  // The single-sequence template: ids to insert, or nullopt for the sequence itself.
  std::vector<std::optional<std::vector<int32_t>>> single_template;

  bool clean_up_spaces = true;
  std::string bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;

  // BPE of one pre-token, appending ids to out.
  void Bpe(std::string_view piece, std::vector<int32_t>& out) const;
  absl::Status EncodePlain(std::string text, size_t section_index, std::vector<int32_t>& out) const;
};

namespace {

absl::Status ParseModel(const Json& model, Tokenizer::Parts& parts) {
  ASSIGN_OR_RETURN(std::string type, GetType(model, "model"));
  if (type != "BPE") return Unsupported("model", type);
  const Json* vocab = Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return Invalid("tokenizer.json", "model.vocab", "must be an object of token -> id");
  }
  if (vocab->size() > static_cast<size_t>(kMaxVocabularySize)) {
    return Invalid("tokenizer.json", "model.vocab", Cat("has more than ", kMaxVocabularySize, " tokens"));
  }
  parts.model_vocab.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= kMaxVocabularySize) {
      return Invalid("tokenizer.json", Cat("model.vocab[\"", token.substr(0, 64), "\"]"),
                     Cat("must be an integer id in [0, ", kMaxVocabularySize, ")"));
    }
    if (token.size() > kMaxTokenSize) {
      return Invalid("tokenizer.json", "model.vocab", Cat("has a token longer than ", kMaxTokenSize, " bytes"));
    }
    parts.model_vocab[token] = static_cast<int32_t>(id_json.get<int64_t>());
  }
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* field = Find(model, key);
    if (field != nullptr && !(field->is_string() && field->get<std::string>().empty())) {
      return Invalid("tokenizer.json", Cat("model.", key), "is not supported (must be null)");
    }
  }
  if (const Json* dropout = Find(model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Invalid("tokenizer.json", "model.dropout", "is not supported (must be null)");
  }
  ASSIGN_OR_RETURN(parts.byte_fallback, GetBool(model, "byte_fallback", "model", false));
  ASSIGN_OR_RETURN(parts.fuse_unk, GetBool(model, "fuse_unk", "model", false));
  ASSIGN_OR_RETURN(parts.ignore_merges, GetBool(model, "ignore_merges", "model", false));
  if (const Json* unk = Find(model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return Invalid("tokenizer.json", "model.unk_token", "must be a string");
    auto it = parts.model_vocab.find(unk->get<std::string>());
    if (it == parts.model_vocab.end()) {
      return Invalid("tokenizer.json", "model.unk_token",
                     Cat("\"", unk->get<std::string>().substr(0, 64), "\" is not in model.vocab"));
    }
    parts.unk_id = it->second;
  }
  parts.byte_token_ids.fill(-1);
  if (parts.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = parts.model_vocab.find(std::string_view(name));
      if (it != parts.model_vocab.end()) parts.byte_token_ids[b] = it->second;
    }
  }

  const Json* merges = Find(model, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return Invalid("tokenizer.json", "model.merges", "must be an array");
  if (merges->size() > static_cast<size_t>(kMaxVocabularySize)) {
    return Invalid("tokenizer.json", "model.merges", Cat("has more than ", kMaxVocabularySize, " entries"));
  }
  parts.merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    std::string left, right;
    const std::string path = Cat("model.merges[", rank, "]");
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Invalid("tokenizer.json", path, "must be two tokens separated by one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Invalid("tokenizer.json", path, "must be \"a b\" or [\"a\", \"b\"]");
    }
    auto left_it = parts.model_vocab.find(left);
    auto right_it = parts.model_vocab.find(right);
    auto merged_it = parts.model_vocab.find(left + right);
    for (const auto& [it, name] : {std::pair{left_it, &left}, std::pair{right_it, &right}}) {
      if (it == parts.model_vocab.end()) {
        return Invalid("tokenizer.json", path,
                       Cat("refers to \"", name->substr(0, 64), "\", which is not in model.vocab"));
      }
    }
    if (merged_it == parts.model_vocab.end()) {
      return Invalid("tokenizer.json", path,
                     Cat("makes \"", (left + right).substr(0, 64), "\", which is not in model.vocab"));
    }
    // The first (lowest-rank) entry for a pair wins.
    parts.merges.emplace(PairKey(left_it->second, right_it->second),
                         MergeValue{static_cast<int32_t>(rank), merged_it->second});
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, Tokenizer::Parts& parts) {
  const Json* list = Find(root, "added_tokens");
  if (list == nullptr) return absl::OkStatus();
  if (!list->is_array()) return Invalid("tokenizer.json", "added_tokens", "must be an array");
  if (list->size() > kMaxAddedTokens) {
    return Invalid("tokenizer.json", "added_tokens", Cat("has more than ", kMaxAddedTokens, " entries"));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string path = Cat("added_tokens[", i, "]");
    if (!entry.is_object()) return Invalid("tokenizer.json", path, "must be an object");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, GetString(entry, "content", path, std::nullopt));
    if (token.content.empty() || token.content.size() > kMaxTokenSize) {
      return Invalid("tokenizer.json", path + ".content", Cat("must be 1 to ", kMaxTokenSize, " bytes"));
    }
    const Json* id = Find(entry, "id");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= kMaxVocabularySize) {
      return Invalid("tokenizer.json", path + ".id", Cat("must be an integer id in [0, ", kMaxVocabularySize, ")"));
    }
    token.id = static_cast<int32_t>(id->get<int64_t>());
    ASSIGN_OR_RETURN(token.special, GetBool(entry, "special", path, false));
    ASSIGN_OR_RETURN(token.lstrip, GetBool(entry, "lstrip", path, false));
    ASSIGN_OR_RETURN(token.rstrip, GetBool(entry, "rstrip", path, false));
    ASSIGN_OR_RETURN(token.single_word, GetBool(entry, "single_word", path, false));
    ASSIGN_OR_RETURN(token.normalized, GetBool(entry, "normalized", path, !token.special));
    parts.added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Json& json, std::string path, int depth, Tokenizer::Parts& parts) {
  if (depth > kMaxComponentDepth) return Invalid("tokenizer.json", path, "is nested too deeply");
  ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = Find(json, "processors");
    if (list == nullptr || !list->is_array()) {
      return Invalid("tokenizer.json", path + ".processors", "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ParsePostProcessor((*list)[i], Cat(path, ".processors[", i, "]"), depth + 1, parts));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only; ids unchanged
  if (type != "TemplateProcessing") return Unsupported(path, type);
  if (parts.has_post_processor) {
    return Invalid("tokenizer.json", path, "is a second TemplateProcessing, which is not supported");
  }
  parts.has_post_processor = true;
  const Json* single = Find(json, "single");
  if (single == nullptr || !single->is_array()) return Invalid("tokenizer.json", path + ".single", "must be an array");
  const Json* special_tokens = Find(json, "special_tokens");
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_path = Cat(path, ".single[", i, "]");
    if (const Json* sequence = Find(item, "Sequence"); sequence != nullptr) {
      ASSIGN_OR_RETURN(std::string id, GetString(*sequence, "id", item_path + ".Sequence", "A"));
      if (id != "A") return Invalid("tokenizer.json", item_path, "must refer to sequence \"A\"");
      parts.single_template.emplace_back(std::nullopt);
      continue;
    }
    const Json* special = Find(item, "SpecialToken");
    if (special == nullptr) return Invalid("tokenizer.json", item_path, "must be a SpecialToken or a Sequence");
    ASSIGN_OR_RETURN(std::string name, GetString(*special, "id", item_path + ".SpecialToken", std::nullopt));
    std::vector<int32_t> ids;
    const Json* listed = special_tokens != nullptr ? Find(*special_tokens, name) : nullptr;
    if (listed != nullptr) {
      const Json* id_list = Find(*listed, "ids");
      if (id_list == nullptr || !id_list->is_array() || id_list->size() > 64) {
        return Invalid("tokenizer.json", Cat(path, ".special_tokens[\"", name.substr(0, 64), "\"].ids"),
                       "must be an array of at most 64 ids");
      }
      for (const Json& id : *id_list) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocabularySize) {
          return Invalid("tokenizer.json", Cat(path, ".special_tokens[\"", name.substr(0, 64), "\"].ids"),
                         "must hold ids in range");
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else {
      auto it = parts.token_to_id.find(name);
      if (it == parts.token_to_id.end()) {
        return Invalid("tokenizer.json", item_path, Cat("names \"", name.substr(0, 64), "\", which is not a token"));
      }
      ids.push_back(it->second);
    }
    parts.single_template.emplace_back(std::move(ids));
  }
  return absl::OkStatus();
}

// A tokenizer_config.json token: a string or {"content": ...}.
absl::StatusOr<std::string> ConfigToken(const Json& config, std::string_view key) {
  const Json* value = Find(config, key);
  if (value == nullptr) return std::string();
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) {
    const Json* content = Find(*value, "content");
    if (content != nullptr && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(Cat(
      "tokenizer_config.json: ", key, " must be a string or an object with a string \"content\""));
}

}  // namespace

void Tokenizer::Parts::Bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    auto it = token_to_id.find(piece);
    if (it != token_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;  // model id, or -1 for a character outside the vocabulary
    int32_t prev, next;
    uint32_t begin, end;  // bytes of piece
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    size_t begin = i;
    i += Utf8Length(static_cast<unsigned char>(piece[i]));
    if (i > piece.size()) i = piece.size();
    auto it = model_vocab.find(piece.substr(begin, i - begin));
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({it == model_vocab.end() ? -1 : it->second, index - 1, index + 1,
                       static_cast<uint32_t>(begin), static_cast<uint32_t>(i)});
  }
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank, left, right, left_id, right_id, merged;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    auto it = merges.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges.end()) return;
    queue.push({it->second.rank, left, right, symbols[left].id, symbols[right].id, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    // Stale entries: a side was merged away or changed since this candidate was queued.
    if (left.id != top.left_id || left.next != top.right || symbols[top.right].id != top.right_id) continue;
    Symbol& right = symbols[top.right];
    left.id = top.merged;
    left.end = right.end;
    left.next = right.next;
    right.id = -2;  // dead
    right.next = -1;
    if (left.next >= 0) symbols[left.next].prev = top.left;
    consider(left.prev);
    consider(top.left);
  }

  const size_t first_output = out.size();
  auto emit_unknown = [&] {
    if (!unk_id.has_value()) return;  // dropped, as transformers.js does without unk_token
    if (fuse_unk && out.size() > first_output && out.back() == *unk_id) return;
    out.push_back(*unk_id);
  };
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& symbol = symbols[i];
    if (symbol.id >= 0) {
      // Contents an added token redefined map to the added id, like transformers.js's lookup.
      if (!overridden_ids.empty()) {
        auto it = overridden_ids.find(symbol.id);
        out.push_back(it != overridden_ids.end() ? it->second : symbol.id);
      } else {
        out.push_back(symbol.id);
      }
      continue;
    }
    std::string_view text = piece.substr(symbol.begin, symbol.end - symbol.begin);
    if (byte_fallback) {
      bool all = true;
      for (unsigned char byte : text) all = all && byte_token_ids[byte] >= 0;
      if (all) {
        for (unsigned char byte : text) out.push_back(byte_token_ids[byte]);
        continue;
      }
    }
    emit_unknown();
  }
}

absl::Status Tokenizer::Parts::EncodePlain(std::string text, size_t section_index,
                                           std::vector<int32_t>& out) const {
  if (normalizer != nullptr) RETURN_IF_ERROR(normalizer->Normalize(text));
  if (text.empty()) return absl::OkStatus();
  std::vector<AddedTokenMatcher::Section> subsections;
  if (normalized_matcher.empty()) {
    subsections.push_back({std::move(text), std::nullopt});
  } else {
    subsections = normalized_matcher.Split(text, added_tokens);
    StripAroundAddedTokens(subsections, added_tokens);
  }
  for (auto& subsection : subsections) {
    if (subsection.text.empty()) continue;
    if (auto it = added_by_content.find(subsection.text); it != added_by_content.end()) {
      out.push_back(added_tokens[it->second].id);
      continue;
    }
    std::vector<std::string> pieces;
    pieces.push_back(std::move(subsection.text));
    if (pre_tokenizer != nullptr) RETURN_IF_ERROR(pre_tokenizer->PreTokenize(pieces, section_index));
    const size_t first_output = out.size();
    for (const std::string& piece : pieces) {
      size_t before = out.size();
      Bpe(piece, out);
      // fuse_unk also joins unknowns across pre-tokens of one section (transformers.js).
      if (fuse_unk && unk_id.has_value() && before > first_output && out.size() > before &&
          out[before - 1] == *unk_id && out[before] == *unk_id) {
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(before));
      }
    }
  }
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json) {
  ASSIGN_OR_RETURN(Json root, ParseJson(tokenizer_json, "tokenizer.json", kMaxTokenizerJsonSize));
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json: must be a JSON object");
  Json config = Json::object();
  if (!tokenizer_config_json.empty()) {
    ASSIGN_OR_RETURN(config, ParseJson(tokenizer_config_json, "tokenizer_config.json", kMaxConfigJsonSize));
    if (!config.is_object()) return absl::InvalidArgumentError("tokenizer_config.json: must be a JSON object");
  }
  try {
    auto parts = std::make_unique<Parts>();
    const Json* model = Find(root, "model");
    if (model == nullptr) return absl::InvalidArgumentError("tokenizer.json: model is missing");
    RETURN_IF_ERROR(ParseModel(*model, *parts));
    RETURN_IF_ERROR(ParseAddedTokens(root, *parts));

    // The id table: the model's tokens, then the added tokens over them.
    int64_t max_id = -1;
    for (const auto& [token, id] : parts->model_vocab) max_id = std::max<int64_t>(max_id, id);
    for (const AddedToken& token : parts->added_tokens) max_id = std::max<int64_t>(max_id, token.id);
    const size_t entries = parts->model_vocab.size() + parts->added_tokens.size();
    if (max_id + 1 > static_cast<int64_t>(entries) + 65536) {
      return absl::InvalidArgumentError(Cat(
          "tokenizer.json: ids go up to ", max_id, " but there are only ", entries,
          " tokens; the id space must be dense"));
    }
    const size_t size = static_cast<size_t>(max_id + 1);
    parts->id_to_token.resize(size);
    parts->id_present.assign(size, 0);
    parts->id_special.assign(size, 0);
    parts->id_byte_token.assign(size, 0);
    for (const auto& [token, id] : parts->model_vocab) {
      if (parts->id_present[id]) {
        return absl::InvalidArgumentError(Cat("tokenizer.json: model.vocab gives id ", id, " to two tokens"));
      }
      parts->id_to_token[id] = token;
      parts->id_present[id] = 1;
    }
    parts->token_to_id = parts->model_vocab;

    DecoderInfo decoder_info;
    if (const Json* decoder = Find(root, "decoder"); decoder != nullptr) {
      ASSIGN_OR_RETURN(parts->decoder, MakeDecoder(*decoder, "decoder", 0, &parts->added_contents, decoder_info));
    }
    if (const Json* normalizer = Find(root, "normalizer"); normalizer != nullptr) {
      ASSIGN_OR_RETURN(parts->normalizer, MakeNormalizer(*normalizer, "normalizer", 0));
    }
    if (const Json* pre_tokenizer = Find(root, "pre_tokenizer"); pre_tokenizer != nullptr) {
      ASSIGN_OR_RETURN(parts->pre_tokenizer, MakePreTokenizer(*pre_tokenizer, "pre_tokenizer", 0));
    }

    std::unordered_set<std::string> special_contents;
    for (size_t i = 0; i < parts->added_tokens.size(); ++i) {
      const AddedToken& token = parts->added_tokens[i];
      parts->id_to_token[token.id] = token.content;
      parts->id_present[token.id] = 1;
      parts->token_to_id[token.content] = token.id;
      if (auto it = parts->model_vocab.find(token.content);
          it != parts->model_vocab.end() && it->second != token.id) {
        parts->overridden_ids[it->second] = token.id;
      }
      parts->added_contents.insert(token.content);
      parts->added_by_content[token.content] = static_cast<int32_t>(i);
      if (token.special) special_contents.insert(token.content);
      if (token.normalized && parts->normalizer != nullptr) {
        std::string normalized = token.content;
        RETURN_IF_ERROR(parts->normalizer->Normalize(normalized));
        parts->added_by_content[normalized] = static_cast<int32_t>(i);
        parts->normalized_matcher.Add(std::move(normalized), i);
      } else {
        parts->raw_matcher.Add(token.content, i);
      }
    }
    parts->raw_matcher.Finish();
    parts->normalized_matcher.Finish();

    if (const Json* extra = Find(config, "additional_special_tokens"); extra != nullptr && extra->is_array()) {
      for (const Json& item : *extra) {
        if (item.is_string()) {
          special_contents.insert(item.get<std::string>());
        } else if (const Json* content = Find(item, "content"); content != nullptr && content->is_string()) {
          special_contents.insert(content->get<std::string>());
        }
      }
    }
    for (size_t id = 0; id < size; ++id) {
      if (!parts->id_present[id]) continue;
      parts->id_special[id] = special_contents.count(parts->id_to_token[id]) > 0;
      parts->id_byte_token[id] = decoder_info.has_byte_fallback &&
                                 ByteFallbackDecoder::ParseByteToken(parts->id_to_token[id]).has_value();
    }

    if (const Json* post = Find(root, "post_processor"); post != nullptr) {
      RETURN_IF_ERROR(ParsePostProcessor(*post, "post_processor", 0, *parts));
      for (const auto& item : parts->single_template) {
        if (!item.has_value()) continue;
        for (int32_t id : *item) {
          if (static_cast<size_t>(id) >= size || !parts->id_present[id]) {
            return absl::InvalidArgumentError(Cat(
                "tokenizer.json: post_processor uses id ", id, ", which has no token"));
          }
        }
      }
    }

    if (const Json* cleanup = Find(config, "clean_up_tokenization_spaces"); cleanup != nullptr) {
      if (!cleanup->is_boolean()) {
        return absl::InvalidArgumentError("tokenizer_config.json: clean_up_tokenization_spaces must be a boolean");
      }
      parts->clean_up_spaces = cleanup->get<bool>();
    }
    ASSIGN_OR_RETURN(parts->bos_token, ConfigToken(config, "bos_token"));
    ASSIGN_OR_RETURN(parts->eos_token, ConfigToken(config, "eos_token"));
    for (auto [token, id] : {std::pair{&parts->bos_token, &parts->bos_id}, std::pair{&parts->eos_token, &parts->eos_id}}) {
      if (token->empty()) continue;
      auto it = parts->token_to_id.find(*token);
      if (it != parts->token_to_id.end()) *id = it->second;
    }
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(parts)));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(Cat("tokenizer.json: unexpected structure: ", e.what()));
  }
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("tokenizer: text is not valid UTF-8");
  const Parts& parts = *parts_;
  std::vector<int32_t> ids;
  std::vector<AddedTokenMatcher::Section> sections;
  if (parts.raw_matcher.empty()) {
    sections.push_back({std::string(text), std::nullopt});
  } else {
    sections = parts.raw_matcher.Split(text, parts.added_tokens);
    StripAroundAddedTokens(sections, parts.added_tokens);
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    auto& section = sections[i];
    if (section.text.empty()) continue;
    if (auto it = parts.added_by_content.find(section.text); it != parts.added_by_content.end()) {
      ids.push_back(parts.added_tokens[it->second].id);
      continue;
    }
    RETURN_IF_ERROR(parts.EncodePlain(std::move(section.text), i, ids));
  }
  if (!add_special_tokens || !parts.has_post_processor) return ids;
  std::vector<int32_t> processed;
  processed.reserve(ids.size() + 4);
  for (const auto& item : parts.single_template) {
    if (item.has_value()) {
      processed.insert(processed.end(), item->begin(), item->end());
    } else {
      processed.insert(processed.end(), ids.begin(), ids.end());
    }
  }
  return processed;
}

absl::StatusOr<std::string> Tokenizer::DecodeRaw(std::span<const int32_t> ids,
                                                 bool skip_special_tokens) const {
  const Parts& parts = *parts_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= parts.id_to_token.size()) {
      return absl::OutOfRangeError(
          Cat("tokenizer: token id ", id, " is out of range [0, ", parts.id_to_token.size(), ")"));
    }
    if (!parts.id_present[id]) {
      return absl::OutOfRangeError(Cat("tokenizer: token id ", id, " has no token"));
    }
    if (skip_special_tokens && parts.id_special[id]) continue;
    tokens.push_back(parts.id_to_token[id]);
  }
  if (parts.decoder == nullptr) return absl::StrJoin(tokens, " ");
  parts.decoder->DecodeChain(tokens);
  return absl::StrJoin(tokens, "");
}

namespace {

// transformers' clean_up_tokenization: drops the space before punctuation and contractions.
std::string CleanUpSpaces(std::string text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},   {" ,", ","},   {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    if (text.find(from) == std::string::npos) continue;
    std::string out;
    out.reserve(text.size());
    size_t previous = 0, at;
    while ((at = text.find(from, previous)) != std::string::npos) {
      out.append(text, previous, at - previous);
      out.append(to);
      previous = at + from.size();
    }
    out.append(text, previous);
    text = std::move(out);
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  ASSIGN_OR_RETURN(std::string text, DecodeRaw(ids, skip_special_tokens));
  if (parts_->clean_up_spaces) text = CleanUpSpaces(std::move(text));
  return text;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(parts_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = parts_->token_to_id.find(token);
  if (it == parts_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= parts_->id_to_token.size() || !parts_->id_present[id]) {
    return std::nullopt;
  }
  return parts_->id_to_token[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < parts_->id_special.size() && parts_->id_special[id];
}

const std::string& Tokenizer::bos_token() const { return parts_->bos_token; }
const std::string& Tokenizer::eos_token() const { return parts_->eos_token; }
std::optional<int32_t> Tokenizer::bos_id() const { return parts_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return parts_->eos_id; }
bool Tokenizer::CleansUpSpaces() const { return parts_->clean_up_spaces; }

bool Tokenizer::IsWeakStreamAnchor(int32_t id, bool skip_special_tokens) const {
  return (skip_special_tokens && parts_->id_special[id]) || parts_->id_byte_token[id];
}

// ---------------------------------------------------------------------------------------------
// StreamDecoder.

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> StreamDecoder::Push(int32_t id) {
  if (!tokenizer_.IdToToken(id).has_value()) {
    return absl::OutOfRangeError(Cat("tokenizer: token id ", id, " is out of range or has no token"));
  }
  window_.push_back(id);
  ASSIGN_OR_RETURN(std::string text, tokenizer_.DecodeRaw(window_, skip_special_tokens_));
  // Hold back while the tail is an unfinished UTF-8 sequence (it decodes as U+FFFD for now), or
  // in the (unexpected) case that the new token rewrote earlier text.
  if (std::string_view(text).ends_with(kReplacementCharacter) || !std::string_view(text).starts_with(window_text_)) {
    return std::string();
  }
  pending_.append(text, window_text_.size());
  window_text_ = std::move(text);
  // Re-anchor on this token when it decodes to clean text on its own: later text is then the
  // difference between decoding [anchor, ...] and decoding [anchor].
  if (window_.size() > 1 && !tokenizer_.IsWeakStreamAnchor(id, skip_special_tokens_)) {
    const int32_t anchor[] = {id};
    absl::StatusOr<std::string> alone = tokenizer_.DecodeRaw(anchor, skip_special_tokens_);
    if (alone.ok() && !alone->empty() && alone->find(kReplacementCharacter) == std::string::npos) {
      window_.assign(1, id);
      window_text_ = *std::move(alone);
    }
  }
  return TakeFinalText(/*finishing=*/false);
}

std::string StreamDecoder::TakeFinalText(bool finishing) {
  if (!tokenizer_.CleansUpSpaces()) return std::exchange(pending_, std::string());
  size_t cut = finishing ? pending_.size() : 0;
  if (!finishing) {
    if (pending_.find(' ') == std::string::npos) {
      cut = pending_.size();
    } else {
      // A cut at a space is final when no clean-up rule can span it: the character before is
      // neither a space nor an apostrophe and the one after is not an apostrophe.
      for (size_t c = pending_.size() - 1; c-- > 1;) {  // c from size - 2 down to 1
        if (pending_[c] == ' ' && pending_[c - 1] != ' ' && pending_[c - 1] != '\'' &&
            pending_[c + 1] != '\'') {
          cut = c;
          break;
        }
      }
    }
  }
  if (cut == 0) return std::string();
  std::string final_text = CleanUpSpaces(pending_.substr(0, cut));
  pending_.erase(0, cut);
  return final_text;
}

std::string StreamDecoder::Finish() {
  absl::StatusOr<std::string> text = tokenizer_.DecodeRaw(window_, skip_special_tokens_);
  if (text.ok() && std::string_view(*text).starts_with(window_text_)) pending_.append(*text, window_text_.size());
  std::string rest = TakeFinalText(/*finishing=*/true);
  window_.clear();
  window_text_.clear();
  pending_.clear();
  return rest;
}

}  // namespace cloister::llm
