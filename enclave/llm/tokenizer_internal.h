// Internals of Tokenizer (tokenizer.h) shared by its source files: the input limits, UTF-8 and
// JSON helpers, patterns, the normalizer, pre-tokenizer and decoder interfaces with their
// factories, added-token matching and Tokenizer::Parts, the parsed pipeline. Not for use
// outside the tokenizer.
// Threading: everything here is immutable once built and safe to share between threads.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "enclave/llm/tokenizer.h"
#include "nlohmann/json.hpp"

namespace cloister::llm::tokenizer_internal {

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
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

bool IsValidUtf8(std::string_view text);

// Decodes the code point at text[i] (valid UTF-8) and advances i.
char32_t NextCodePoint(std::string_view text, size_t& i);

void AppendCodePoint(char32_t code_point, std::string& out);

// Appends bytes as UTF-8, replacing each maximal ill-formed subpart with U+FFFD (the WHATWG
// TextDecoder and Rust from_utf8_lossy rule).
void AppendLossyUtf8(std::string_view bytes, std::string& out);

// JavaScript's String.prototype.trim whitespace (WhiteSpace and LineTerminator).
bool IsJsWhitespace(char32_t c);

std::string_view TrimStartJs(std::string_view text);

std::string_view TrimEndJs(std::string_view text);

bool IsWordCharacter(char32_t c);

// ---------------------------------------------------------------------------------------------
// JSON helpers: every error names the key path in the file.

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

absl::Status Invalid(std::string_view file, std::string_view path, std::string_view what);

// Rejects nesting deeper than kMaxJsonDepth before the parser sees it.
absl::Status CheckJsonDepth(std::string_view text, std::string_view file);

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view file, size_t max_size);

const Json* Find(const Json& object, std::string_view key);

absl::StatusOr<bool> GetBool(const Json& object, std::string_view key, std::string_view path,
                             bool fallback);

absl::StatusOr<std::string> GetString(const Json& object, std::string_view key,
                                      std::string_view path, std::optional<std::string> fallback);

absl::StatusOr<std::string> GetType(const Json& component, std::string_view path);

absl::Status Unsupported(std::string_view path, std::string_view type);

// ---------------------------------------------------------------------------------------------
// Patterns: a literal string or a PCRE2 regex (UTF + UCP), matched globally like a JavaScript
// /gu regex (after an empty match the search resumes one code point later).

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};

class Pattern {
 public:
  static absl::StatusOr<Pattern> Regex(std::string_view source, std::string_view path);
  static absl::StatusOr<Pattern> Literal(std::string literal, std::string_view path);

  // Parses {"String": "..."} or {"Regex": "..."}.
  static absl::StatusOr<Pattern> FromJson(const Json& json, std::string_view path);

  // Non-overlapping matches as [begin, end) byte ranges, empty matches included.
  absl::Status FindAll(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>& matches) const;

  // JavaScript replaceAll with a plain replacement string.
  absl::StatusOr<std::string> ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<pcre2_code> regex_;
};

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

const ByteLevelTables& ByteLevel();

// ---------------------------------------------------------------------------------------------
// Normalizers.

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string& text) const = 0;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& json, std::string path,
                                                           int depth);

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: each maps every piece to zero or more pieces, in order.

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // section_index: index of the added-token section the text came from (Metaspace "first").
  virtual absl::Status PreTokenize(std::vector<std::string>& pieces, size_t section_index) const = 0;
};

enum class PrependScheme { kAlways, kFirst, kNever };

absl::StatusOr<PrependScheme> GetPrependScheme(const Json& json, std::string_view path);

absl::StatusOr<std::string> GetReplacement(const Json& json, std::string_view path);

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& json, std::string path,
                                                               int depth);

// ---------------------------------------------------------------------------------------------
// Decoders: each rewrites the list of token strings, then the pieces are joined.

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
};

struct DecoderInfo {
  bool has_byte_fallback = false;
};

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(
    const Json& json, std::string path, int depth,
    const std::unordered_set<std::string>* added_contents, DecoderInfo& info);

// The byte of a byte-fallback token "<0xNN>", or nullopt for any other token.
std::optional<uint8_t> ParseByteToken(std::string_view token);

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
  void Add(std::string pattern, size_t token_index);
  void Finish();
  bool empty() const { return entries_.empty(); }

  struct Section {
    std::string text;
    std::optional<size_t> token;  // index into the added tokens
  };

  // Splits text into plain sections and added-token sections.
  std::vector<Section> Split(std::string_view text, const std::vector<AddedToken>& tokens) const;

 private:
  struct Entry {
    std::string pattern;
    size_t token;
  };

  static bool IsWholeWord(std::string_view text, size_t begin, size_t end);

  std::vector<Entry> entries_;
  std::array<std::pair<size_t, size_t>, 256> first_{};
};

// Applies lstrip / rstrip of added-token sections to their neighbours.
void StripAroundAddedTokens(std::vector<AddedTokenMatcher::Section>& sections,
                            const std::vector<AddedToken>& tokens);

// ---------------------------------------------------------------------------------------------
// BPE.

struct MergeValue {
  int32_t rank;
  int32_t merged;
};

inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace cloister::llm::tokenizer_internal

namespace cloister::llm {

// The parsed pipeline: vocabulary, BPE model, added tokens and the components.
struct Tokenizer::Parts {
  // Ids and contents, added tokens overriding the model's entries (as transformers.js does).
  std::vector<std::string> id_to_token;
  std::vector<uint8_t> id_present;
  std::vector<uint8_t> id_special;
  std::vector<uint8_t> id_byte_token;  // a <0xNN> token (only tracked with ByteFallback decoding)
  tokenizer_internal::TokenMap token_to_id;

  // The BPE model.
  tokenizer_internal::TokenMap model_vocab;
  std::unordered_map<uint64_t, tokenizer_internal::MergeValue> merges;
  std::optional<int32_t> unk_id;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_token_ids{};
  // Model ids whose content an added token with another id took over -> that added id.
  std::unordered_map<int32_t, int32_t> overridden_ids;

  std::vector<tokenizer_internal::AddedToken> added_tokens;
  // Content and normalized content -> index into added_tokens.
  tokenizer_internal::TokenMap added_by_content;
  std::unordered_set<std::string> added_contents;
  tokenizer_internal::AddedTokenMatcher raw_matcher;
  tokenizer_internal::AddedTokenMatcher normalized_matcher;

  std::unique_ptr<tokenizer_internal::Normalizer> normalizer;
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tokenizer_internal::Decoder> decoder;
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

}  // namespace cloister::llm
