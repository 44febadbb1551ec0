// Normalizers: Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Lowercase and Strip.
#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

namespace {

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

}  // namespace

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

}  // namespace cloister::llm::tokenizer_internal
