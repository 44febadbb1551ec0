// Encoding: added tokens found in the text (leftmost, then longest), then per plain section
// the normalizer, the pre-tokenizer and BPE by merge rank, then the post-processor's template.
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/tokenizer.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

// ---------------------------------------------------------------------------------------------
// Added tokens.

void AddedTokenMatcher::Add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;
  entries_.push_back({std::move(pattern), token_index});
}

void AddedTokenMatcher::Finish() {
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

std::vector<AddedTokenMatcher::Section> AddedTokenMatcher::Split(
    std::string_view text, const std::vector<AddedToken>& tokens) const {
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

bool AddedTokenMatcher::IsWholeWord(std::string_view text, size_t begin, size_t end) {
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

}  // namespace cloister::llm::tokenizer_internal

namespace cloister::llm {

using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::IsValidUtf8;
using tokenizer_internal::PairKey;
using tokenizer_internal::StripAroundAddedTokens;
using tokenizer_internal::Utf8Length;

// ---------------------------------------------------------------------------------------------
// BPE.

namespace {

// A run of bytes of the piece being merged, in a doubly linked list.
struct BpeSymbol {
  int32_t id;  // model id, or -1 for a character outside the vocabulary (-2: merged away)
  int32_t prev, next;
  uint32_t begin, end;  // bytes of piece
};

// One symbol per UTF-8 character of `piece` (not empty).
std::vector<BpeSymbol> SplitCharacters(std::string_view piece,
                                       const tokenizer_internal::TokenMap& model_vocab) {
  std::vector<BpeSymbol> symbols;
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
  return symbols;
}

// Merges adjacent symbols, lowest merge rank first (leftmost among equals), until none applies.
void MergeSymbols(const std::unordered_map<uint64_t, tokenizer_internal::MergeValue>& merges,
                  std::vector<BpeSymbol>& symbols) {
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
    BpeSymbol& left = symbols[top.left];
    // Stale entries: a side was merged away or changed since this candidate was queued.
    if (left.id != top.left_id || left.next != top.right || symbols[top.right].id != top.right_id) continue;
    BpeSymbol& right = symbols[top.right];
    left.id = top.merged;
    left.end = right.end;
    left.next = right.next;
    right.id = -2;  // dead
    right.next = -1;
    if (left.next >= 0) symbols[left.next].prev = top.left;
    consider(left.prev);
    consider(top.left);
  }
}

// Appends the ids of the merged symbols: overridden ids mapped to their added token, a symbol
// outside the vocabulary as its byte tokens (byte_fallback) or the unknown token.
void EmitSymbols(const Tokenizer::Parts& parts, std::string_view piece,
                 const std::vector<BpeSymbol>& symbols, std::vector<int32_t>& out) {
  const size_t first_output = out.size();
  auto emit_unknown = [&] {
    if (!parts.unk_id.has_value()) return;  // dropped, as transformers.js does without unk_token
    if (parts.fuse_unk && out.size() > first_output && out.back() == *parts.unk_id) return;
    out.push_back(*parts.unk_id);
  };
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const BpeSymbol& symbol = symbols[i];
    if (symbol.id >= 0) {
      // Contents an added token redefined map to the added id, like transformers.js's lookup.
      if (!parts.overridden_ids.empty()) {
        auto it = parts.overridden_ids.find(symbol.id);
        out.push_back(it != parts.overridden_ids.end() ? it->second : symbol.id);
      } else {
        out.push_back(symbol.id);
      }
      continue;
    }
    std::string_view text = piece.substr(symbol.begin, symbol.end - symbol.begin);
    if (parts.byte_fallback) {
      bool all = true;
      for (unsigned char byte : text) all = all && parts.byte_token_ids[byte] >= 0;
      if (all) {
        for (unsigned char byte : text) out.push_back(parts.byte_token_ids[byte]);
        continue;
      }
    }
    emit_unknown();
  }
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
  std::vector<BpeSymbol> symbols = SplitCharacters(piece, model_vocab);
  MergeSymbols(merges, symbols);
  EmitSymbols(*this, piece, symbols, out);
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

}  // namespace cloister::llm
