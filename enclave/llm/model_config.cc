#include "enclave/llm/model_config.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

using nlohmann::json;

absl::Status ConfigError(std::string_view file, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(file), ": ", std::string(message)));
}

absl::StatusOr<json> ParseObject(std::string_view file, std::string_view text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return ConfigError(file, "not valid JSON");
  if (!value.is_object()) return ConfigError(file, "not a JSON object");
  return value;
}

// An integer key within [min, max]; `fallback` when absent or null.
absl::StatusOr<int64_t> IntKey(std::string_view file, const json& object, const char* key,
                               std::optional<int64_t> fallback, int64_t min, int64_t max) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    if (fallback) return *fallback;
    return ConfigError(file, absl::StrCat("missing key \"", key, "\""));
  }
  if (!it->is_number_integer()) {
    return ConfigError(file, absl::StrCat("\"", key, "\" must be an integer"));
  }
  int64_t value = it->get<int64_t>();
  if (value < min || value > max) {
    return ConfigError(file, absl::StrCat("\"", key, "\" must be in [", min, ", ", max, "], got ",
                                          value));
  }
  return value;
}

absl::StatusOr<double> NumberKey(std::string_view file, const json& object, const char* key,
                                 double fallback, double min, double max) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number()) return ConfigError(file, absl::StrCat("\"", key, "\" must be a number"));
  double value = it->get<double>();
  if (!std::isfinite(value) || value < min || value > max) {
    return ConfigError(file, absl::StrCat("\"", key, "\" must be in [", min, ", ", max, "], got ",
                                          value));
  }
  return value;
}

absl::StatusOr<bool> BoolKey(std::string_view file, const json& object, const char* key,
                             bool fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return ConfigError(file, absl::StrCat("\"", key, "\" must be true or false"));
  return it->get<bool>();
}

// eos_token_id: an integer or a list of integers.
absl::StatusOr<std::vector<int32_t>> TokenIds(std::string_view file, const json& value,
                                              const char* key) {
  std::vector<int32_t> ids;
  auto add = [&](const json& item) -> absl::Status {
    if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
        item.get<int64_t>() > INT32_MAX) {
      return ConfigError(file, absl::StrCat("\"", key, "\" must hold non-negative token ids"));
    }
    ids.push_back(static_cast<int32_t>(item.get<int64_t>()));
    return absl::OkStatus();
  };
  if (value.is_array()) {
    for (const json& item : value) RETURN_IF_ERROR(add(item));
  } else if (!value.is_null()) {
    RETURN_IF_ERROR(add(value));
  }
  return ids;
}

// Keys whose presence with a non-default value would change the model's output in a way this
// engine does not implement.
absl::Status RefuseUnsupported(std::string_view file, const json& config) {
  auto value_of = [&](const char* key) -> const json* {
    auto it = config.find(key);
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* act = value_of("hidden_act"); act && *act != "silu") {
    return ConfigError(file, absl::StrCat("hidden_act ", act->dump(), " is not supported (silu)"));
  }
  if (const json* tp = value_of("pretraining_tp"); tp && *tp != 1) {
    return ConfigError(file, absl::StrCat("pretraining_tp ", tp->dump(), " is not supported (1)"));
  }
  if (const json* bias = value_of("mlp_bias"); bias && *bias != false) {
    return ConfigError(file, "mlp_bias true is not supported");
  }
  if (const json* quant = value_of("quantization_config"); quant) {
    return ConfigError(file, "quantization_config is not supported (BF16, F16 or F32 weights)");
  }
  if (const json* partial = value_of("partial_rotary_factor"); partial && *partial != 1 &&
                                                               *partial != 1.0) {
    return ConfigError(file, "partial_rotary_factor other than 1 is not supported");
  }
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(std::string_view file, const json& config, ModelConfig& out) {
  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return ConfigError(file, "rope_scaling must be an object or null");
  const json& scaling = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = scaling.find(key);
    if (t != scaling.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return ConfigError(file, absl::StrCat("rope_scaling type \"", type,
                                          "\" is not supported (llama3, default)"));
  }
  RopeScaling& rope = out.rope_scaling;
  rope.type = RopeScaling::Type::kLlama3;
  ASSIGN_OR_RETURN(rope.factor, NumberKey(file, scaling, "factor", 8.0, 1.0, 1e6));
  ASSIGN_OR_RETURN(rope.low_freq_factor,
                   NumberKey(file, scaling, "low_freq_factor", 1.0, 1e-6, 1e6));
  ASSIGN_OR_RETURN(rope.high_freq_factor,
                   NumberKey(file, scaling, "high_freq_factor", 4.0, 1e-6, 1e6));
  if (rope.high_freq_factor <= rope.low_freq_factor) {
    return ConfigError(file, "rope_scaling high_freq_factor must exceed low_freq_factor");
  }
  ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                   IntKey(file, scaling, "original_max_position_embeddings", 8192, 1, 1 << 24));
  return absl::OkStatus();
}

// architectures: one name this engine implements.
absl::Status ParseArchitecture(std::string_view file, const json& config, ModelConfig& out) {
  auto arch = config.find("architectures");
  if (arch == config.end() || !arch->is_array() || arch->size() != 1 ||
      !(*arch)[0].is_string()) {
    return ConfigError(file, "\"architectures\" must be a list of one name");
  }
  out.architecture_name = (*arch)[0].get<std::string>();
  if (out.architecture_name == "LlamaForCausalLM") {
    out.architecture = Architecture::kLlama;
  } else if (out.architecture_name == "Qwen2ForCausalLM") {
    out.architecture = Architecture::kQwen2;
  } else if (out.architecture_name == "MistralForCausalLM") {
    out.architecture = Architecture::kMistral;
  } else {
    return ConfigError(file, absl::StrCat("architectures[0] \"", out.architecture_name,
                                          "\" is not supported (LlamaForCausalLM, "
                                          "Qwen2ForCausalLM, MistralForCausalLM)"));
  }
  return absl::OkStatus();
}

// The shapes, normalization and RoPE keys.
absl::Status ParseDimensions(std::string_view file, const json& config, ModelConfig& out) {
  constexpr int64_t kMaxDim = 1 << 20;
  ASSIGN_OR_RETURN(out.vocab_size, IntKey(file, config, "vocab_size", std::nullopt, 1, 1 << 24));
  ASSIGN_OR_RETURN(out.hidden_size, IntKey(file, config, "hidden_size", std::nullopt, 1, kMaxDim));
  ASSIGN_OR_RETURN(out.intermediate_size,
                   IntKey(file, config, "intermediate_size", std::nullopt, 1, kMaxDim));
  ASSIGN_OR_RETURN(out.num_layers,
                   IntKey(file, config, "num_hidden_layers", std::nullopt, 1, 1024));
  ASSIGN_OR_RETURN(out.num_heads,
                   IntKey(file, config, "num_attention_heads", std::nullopt, 1, 4096));
  ASSIGN_OR_RETURN(out.num_kv_heads,
                   IntKey(file, config, "num_key_value_heads", out.num_heads, 1, 4096));
  if (out.num_heads % out.num_kv_heads != 0) {
    return ConfigError(file, absl::StrCat("num_attention_heads (", out.num_heads,
                                          ") must be a multiple of num_key_value_heads (",
                                          out.num_kv_heads, ")"));
  }
  std::optional<int64_t> default_head_dim;
  if (out.hidden_size % out.num_heads == 0) default_head_dim = out.hidden_size / out.num_heads;
  ASSIGN_OR_RETURN(out.head_dim, IntKey(file, config, "head_dim", default_head_dim, 2, 1024));
  if (out.head_dim % 2 != 0) return ConfigError(file, "head_dim must be even (RoPE pairs)");
  ASSIGN_OR_RETURN(out.max_position_embeddings,
                   IntKey(file, config, "max_position_embeddings", std::nullopt, 1, 1 << 24));
  ASSIGN_OR_RETURN(out.rms_norm_eps, NumberKey(file, config, "rms_norm_eps", 1e-6, 0, 1));
  ASSIGN_OR_RETURN(out.rope_theta, NumberKey(file, config, "rope_theta", 10000.0, 1, 1e12));
  return ParseRopeScaling(file, config, out);
}

// Sliding window: Mistral's when set; Qwen2's only when use_sliding_window is true.
absl::Status ParseSlidingWindow(std::string_view file, const json& config, ModelConfig& out) {
  auto window = config.find("sliding_window");
  bool use_window = out.architecture == Architecture::kMistral;
  if (out.architecture == Architecture::kQwen2) {
    ASSIGN_OR_RETURN(use_window, BoolKey(file, config, "use_sliding_window", false));
    if (use_window) {
      return ConfigError(file, "use_sliding_window true is not supported for Qwen2ForCausalLM");
    }
  }
  if (use_window) {
    // Absent means transformers' MistralConfig default (4096); null means no window.
    std::optional<int64_t> w;
    if (window == config.end()) {
      w = 4096;
    } else if (!window->is_null()) {
      ASSIGN_OR_RETURN(w, IntKey(file, config, "sliding_window", std::nullopt, 1, 1 << 24));
    }
    if (w && *w < out.max_position_embeddings) out.sliding_window = w;
  }
  return absl::OkStatus();
}

// generation_config.json: its special tokens override config.json's; the sampling defaults.
absl::Status ParseGenerationConfig(std::string_view generation_config_json, ModelConfig& out) {
  constexpr std::string_view kGen = "generation_config.json";
  ASSIGN_OR_RETURN(json gen, ParseObject(kGen, generation_config_json));
  if (auto eos = gen.find("eos_token_id"); eos != gen.end() && !eos->is_null()) {
    ASSIGN_OR_RETURN(out.eos_token_ids, TokenIds(kGen, *eos, "eos_token_id"));
  }
  if (auto bos = gen.find("bos_token_id"); bos != gen.end() && !bos->is_null()) {
    ASSIGN_OR_RETURN(auto ids, TokenIds(kGen, *bos, "bos_token_id"));
    if (ids.size() == 1) out.bos_token_id = ids[0];
  }
  ASSIGN_OR_RETURN(out.default_do_sample, BoolKey(kGen, gen, "do_sample", false));
  ASSIGN_OR_RETURN(out.default_temperature, NumberKey(kGen, gen, "temperature", 1.0, 0, 100));
  ASSIGN_OR_RETURN(out.default_top_p, NumberKey(kGen, gen, "top_p", 1.0, 0, 1));
  ASSIGN_OR_RETURN(out.default_top_k, IntKey(kGen, gen, "top_k", 0, 0, 1 << 24));
  ASSIGN_OR_RETURN(out.default_repetition_penalty,
                   NumberKey(kGen, gen, "repetition_penalty", 1.0, 1e-3, 100));
  if (auto max_new = gen.find("max_new_tokens"); max_new != gen.end() && !max_new->is_null()) {
    ASSIGN_OR_RETURN(int64_t n, IntKey(kGen, gen, "max_new_tokens", std::nullopt, 1, 1 << 24));
    out.default_max_new_tokens = n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view config_json,
                                             std::string_view generation_config_json) {
  constexpr std::string_view kFile = "config.json";
  ASSIGN_OR_RETURN(json config, ParseObject(kFile, config_json));
  ModelConfig out;
  RETURN_IF_ERROR(ParseArchitecture(kFile, config, out));
  RETURN_IF_ERROR(RefuseUnsupported(kFile, config));
  RETURN_IF_ERROR(ParseDimensions(kFile, config, out));

  ASSIGN_OR_RETURN(out.tie_word_embeddings,
                   BoolKey(kFile, config, "tie_word_embeddings", false));
  if (out.architecture == Architecture::kQwen2) {
    out.qkv_bias = true;
  } else {
    ASSIGN_OR_RETURN(out.qkv_bias, BoolKey(kFile, config, "attention_bias", false));
  }
  RETURN_IF_ERROR(ParseSlidingWindow(kFile, config, out));

  if (auto bos = config.find("bos_token_id"); bos != config.end() && !bos->is_null()) {
    ASSIGN_OR_RETURN(auto ids, TokenIds(kFile, *bos, "bos_token_id"));
    if (ids.size() == 1) out.bos_token_id = ids[0];
  }
  if (auto eos = config.find("eos_token_id"); eos != config.end()) {
    ASSIGN_OR_RETURN(out.eos_token_ids, TokenIds(kFile, *eos, "eos_token_id"));
  }
  if (!generation_config_json.empty()) {
    RETURN_IF_ERROR(ParseGenerationConfig(generation_config_json, out));
  }
  for (int32_t id : out.eos_token_ids) {
    if (id >= out.vocab_size) {
      return ConfigError(kFile, absl::StrCat("eos token id ", id, " is not below vocab_size ",
                                             out.vocab_size));
    }
  }
  return out;
}

}  // namespace cloister::llm
