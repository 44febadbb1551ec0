// ModelConfig: what the engine needs from a Hugging Face checkpoint's config.json (and the
// generation defaults of generation_config.json), checked once at load. Architectures:
// LlamaForCausalLM (Llama 2 and 3.x with rope_scaling "llama3", SmolLM, TinyLlama),
// Qwen2ForCausalLM (q/k/v bias, tied embeddings) and MistralForCausalLM (sliding window).
// A key the engine cannot honour is an error that names it; nothing is silently ignored that
// would change the model's output.
// Thread-safe: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::llm {

enum class Architecture { kLlama, kQwen2, kMistral };

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama's attention_bias
  // Mistral's sliding window (tokens a query attends to, itself included), where configured.
  std::optional<int64_t> sliding_window;
  std::optional<int32_t> bos_token_id;
  // Generation stops at each of these: generation_config.json's eos_token_id, else config.json's.
  std::vector<int32_t> eos_token_ids;
  // generation_config.json's defaults (absent keys keep these).
  double default_temperature = 1.0;
  double default_top_p = 1.0;
  int64_t default_top_k = 0;
  bool default_do_sample = false;
  double default_repetition_penalty = 1.0;
  std::optional<int64_t> default_max_new_tokens;
};

// Parses config.json and, when not empty, generation_config.json. Errors name the file and key:
// "config.json: architectures[0] \"GPT2LMHeadModel\" is not supported (LlamaForCausalLM,
// Qwen2ForCausalLM, MistralForCausalLM)".
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json,
                                             std::string_view generation_config_json);

}  // namespace cloister::llm
