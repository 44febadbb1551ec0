// Pre-tokenizers: Sequence, ByteLevel (with the GPT-2 regex), Split, Digits and Metaspace, and
// the Metaspace settings that the Metaspace decoder shares.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

namespace {

// The GPT-2 pre-tokenizer regex that ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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
      // insert(0, 1, ' ') rather than insert(0, " "), which trips a GCC 12 -Wrestrict false alarm.
      if (add_prefix_space_ && !std::string_view(piece).starts_with(" ")) piece.insert(0, 1, ' ');
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

}  // namespace

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

}  // namespace cloister::llm::tokenizer_internal
