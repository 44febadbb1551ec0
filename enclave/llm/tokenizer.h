// Hugging Face `tokenizer.json` tokenizers (the "tokenizers" library format) for the enclave's
// LLM engine: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM) and SentencePiece-style BPE with
// byte fallback (Llama 2, Mistral, TinyLlama). Encode runs added-token matching, normalizer,
// pre-tokenizer, BPE and post-processor; Decode runs the decoder chain. The reference for every
// behaviour is transformers.js (tests/conformance/llm/tokenizer_reference.mjs writes goldens).
//
// Threading: a loaded Tokenizer is immutable; Encode, Decode and the lookups are safe to call from
// several threads at once. A StreamDecoder is one sequence's state: use it from one thread.
// Ownership: Load copies what it needs out of the JSON text; a StreamDecoder borrows its
// Tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cloister::llm {

class Tokenizer {
 public:
  // Parses tokenizer.json (and tokenizer_config.json, which may be empty) from a tenant. Bad
  // JSON, a component type we do not implement (named by its key, e.g. `tokenizer.json:
  // model.type "Unigram" is not supported`), merges naming unknown tokens, and inputs beyond the
  // size limits below are errors. The work is linear in the input size.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(std::string_view tokenizer_json,
                                                         std::string_view tokenizer_config_json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // HF encode: added tokens are matched in the text first (lstrip, rstrip, single_word and
  // normalized honoured), the rest goes through normalizer, pre-tokenizer and BPE; with
  // add_special_tokens the post-processor's template (e.g. BOS first) is applied. Text that is
  // not valid UTF-8 is an error.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const;

  // HF decode through the decoder chain, then clean_up_tokenization_spaces when
  // tokenizer_config.json asks for it (absent: true, as transformers does). An id that is
  // negative, >= vocab_size() or has no token is an error. Invalid UTF-8 becomes U+FFFD.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // Max id + 1, added tokens included.
  int32_t vocab_size() const;
  // The id of a vocabulary or added token, by its exact content.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's content; nullopt for an id without a token.
  std::optional<std::string_view> IdToToken(int32_t id) const;
  // True for special added tokens (and tokenizer_config's additional_special_tokens).
  bool IsSpecial(int32_t id) const;

  // From tokenizer_config.json (bos_token / eos_token, a string or {"content": ...}); empty when
  // absent. The ids are nullopt when the token is absent or not in the vocabulary.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  struct Parts;  // the parsed pipeline, defined in tokenizer.cc

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::unique_ptr<Parts> parts);

  // Decode without clean_up_tokenization_spaces; the stream decoder does that part itself.
  absl::StatusOr<std::string> DecodeRaw(std::span<const int32_t> ids,
                                        bool skip_special_tokens) const;
  bool CleansUpSpaces() const;
  // True when `id` decodes to nothing by itself or must not anchor a streaming window (skipped
  // special tokens, byte-fallback <0xNN> tokens).
  bool IsWeakStreamAnchor(int32_t id, bool skip_special_tokens) const;

  std::unique_ptr<const Parts> parts_;
};

// Streaming detokenizer for generation. Push returns only text that is final and whole UTF-8: it
// holds back an incomplete UTF-8 sequence (a byte-fallback or byte-level run cut in the middle)
// and, when clean_up_tokenization_spaces is on, a short tail that a later token could still
// change. Concatenating every Push result and Finish() equals Tokenizer::Decode of all ids,
// including SentencePiece's rule that only the very first token loses its leading space.
// Cost per Push is proportional to the few tokens since the last clean boundary.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one id and returns the text that became final (often empty). An id out of range is an
  // error and leaves the state unchanged.
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns whatever is held back (invalid UTF-8 as U+FFFD, as HF decodes it) and resets the
  // decoder for a new sequence.
  std::string Finish();

 private:
  // Moves the text before the last cut that clean-up cannot reach out of pending_.
  std::string TakeFinalText(bool finishing);

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // Ids from the current anchor on: the first is a token whose decoding is context-free, so
  // decoding the window and dropping window_text_ yields exactly the new text.
  std::vector<int32_t> window_;
  std::string window_text_;  // decoding of window_ already moved to pending_
  std::string pending_;      // decoded text not yet returned (clean-up hold-back)
};

}  // namespace cloister::llm
