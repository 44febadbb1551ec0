// Tokenizer: decoding and the lookups, and the StreamDecoder. Loading is in tokenizer_load.cc,
// encoding in tokenizer_encode.cc; the pipeline's components and helpers are in
// tokenizer_support.cc, tokenizer_normalizers.cc, tokenizer_pre_tokenizers.cc and
// tokenizer_decoders.cc (tokenizer_internal.h declares what they share).
#include "enclave/llm/tokenizer.h"

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm {

using tokenizer_internal::kReplacementCharacter;

Tokenizer::Tokenizer(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
Tokenizer::~Tokenizer() = default;

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
