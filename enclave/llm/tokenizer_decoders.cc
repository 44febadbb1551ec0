// Decoders: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse and Strip. Each
// rewrites the list of token strings; Tokenizer::Decode joins what is left.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

std::optional<uint8_t> ParseByteToken(std::string_view token) {
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

namespace {

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

}  // namespace

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

}  // namespace cloister::llm::tokenizer_internal
