// Generator: continuous batching over one Model. Sequences join (Add) and leave between steps;
// each Step() runs the model once over the decode tokens of running sequences and prefill chunks
// of new ones (chunked prefill under a per-step token budget, so a long prompt never stalls the
// others), samples, detokenizes (whole UTF-8 only) and applies stop strings, eos ids and
// max_tokens. KV blocks come from a BlockManager and are scrubbed when a sequence leaves.
//
// Threading: not thread-safe; one thread owns a Generator and calls Step in a loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "enclave/llm/engine.h"
#include "enclave/llm/model.h"
#include "enclave/llm/sampler.h"

namespace cloister::llm {

struct GeneratorOptions {
  int32_t threads = 1;
  int32_t block_size = 16;
  // Blocks in the KV cache; 0 sizes it for max_sequences full contexts.
  int32_t kv_blocks = 0;
  int32_t max_sequences = 16;
  // Tokens one step may carry (decode tokens first, then prefill chunks).
  int32_t max_step_tokens = 512;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled };
std::string_view FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;         // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;   // besides the model's eos ids
  bool ignore_eos = false;
  // Whose KV blocks these are (quota) and the tenant's prefix-cache salt, derived in the enclave
  // and never taken from a request; an empty salt turns the prefix cache off for this sequence.
  std::string tenant = "local";
  std::vector<uint8_t> prefix_salt;
};

// What one step produced for one sequence.
struct TokenEvent {
  uint64_t sequence = 0;
  SampledToken token;
  std::string text;  // text that became final with this token (whole UTF-8)
  FinishReason finish = FinishReason::kNone;
  // On the finishing event: prompt tokens whose KV came from the prefix cache, tokens generated.
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
};

// The KV blocks `options` ask for: kv_blocks, or (0) enough for max_sequences full contexts.
absl::StatusOr<int32_t> KvBlocksFor(const ModelConfig& config, const GeneratorOptions& options);

class Generator {
 public:
  // On the CPU engine with options.threads threads.
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const Model& model,
                                                          const GeneratorOptions& options);
  // On `engine` (its block size must be options.block_size; its blocks are the cache).
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const Model& model,
                                                          const GeneratorOptions& options,
                                                          std::unique_ptr<StepEngine> engine);
  ~Generator();

  // Queues a sequence; refuses a prompt that does not fit the context or bad sampling values.
  absl::StatusOr<uint64_t> Add(GenerationRequest request);
  // Stops the sequence before the next step and frees its blocks at once.
  void Cancel(uint64_t sequence);
  bool idle() const;
  // One engine step; events for the sequences that sampled a token (or were cancelled).
  absl::StatusOr<std::vector<TokenEvent>> Step();

  const StepEngine& engine() const;
  // Sequences added and not yet finished (waiting or running).
  size_t active() const;

  class Impl;

 private:
  explicit Generator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cloister::llm
