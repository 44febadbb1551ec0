#include "enclave/llm/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/llm/chat_template.h"
#include "enclave/llm/kernels.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {

namespace {

std::string_view AsText(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Memory for weights: 64-byte aligned, zeroed before it is returned to the system.
struct AlignedBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  AlignedBuffer() = default;
  ~AlignedBuffer() {
    if (data) {
      std::memset(data, 0, size);
      std::free(data);
    }
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  // Once, on an empty buffer.
  void Allocate(size_t bytes) {
    size = bytes;
    data = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  }
};

}  // namespace

struct Model::Weights {
  struct Layer {
    std::vector<float> input_norm;
    std::vector<float> post_norm;
    WeightMatrix qkv;  // [q_dim + 2 * kv_dim, hidden]
    std::vector<float> qkv_bias;
    WeightMatrix o;        // [hidden, q_dim]
    WeightMatrix gate_up;  // [2 * ffn, hidden]: gate rows, then up rows
    WeightMatrix down;     // [hidden, ffn]
  };
  AlignedBuffer storage;
  WeightMatrix embed;
  WeightMatrix lm_head;
  std::vector<float> final_norm;
  std::vector<Layer> layers;
  std::vector<float> inv_freq;  // head_dim / 2 RoPE frequencies (llama3 scaling applied)
};

Model::Model() = default;
Model::~Model() = default;

// The RoPE inverse frequencies as transformers computes them in float32, with the llama3
// rescaling of long wavelengths where configured.
std::vector<float> RopeFrequencies(const ModelConfig& config) {
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(config.rope_theta), exponent);
  }
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == RopeScaling::Type::kLlama3) {
    const double old_context = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_wavelen = old_context / scaling.low_freq_factor;
    const double high_wavelen = old_context / scaling.high_freq_factor;
    for (float& f : inv_freq) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / scaling.factor);
      } else if (wavelen >= high_wavelen) {
        const float smooth = static_cast<float>(
            (old_context / wavelen - scaling.low_freq_factor) /
            (scaling.high_freq_factor - scaling.low_freq_factor));
        f = (1.0f - smooth) * f / static_cast<float>(scaling.factor) + smooth * f;
      }
    }
  }
  return inv_freq;
}

namespace {

struct PlannedMatrix {
  std::vector<const TensorView*> parts;  // stacked by rows
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
  size_t offset = 0;  // in the storage buffer
  WeightMatrix* target = nullptr;
};

}  // namespace

std::vector<float> TensorToFloat(const TensorView& tensor) {
  std::vector<float> out(tensor.count());
  const size_t size = DTypeSize(tensor.dtype);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = ElementToFloat(tensor.dtype, tensor.data.data() + i * size);
  }
  return out;
}

absl::StatusOr<CheckpointTensors> PlanCheckpointTensors(const Checkpoint& checkpoint,
                                                        const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = config.num_heads * config.head_dim;
  const int64_t kv_dim = config.num_kv_heads * config.head_dim;
  const int64_t ffn = config.intermediate_size;
  std::set<std::string, std::less<>> used;
  auto need = [&](const std::string& name,
                  std::vector<int64_t> shape) -> absl::StatusOr<const TensorView*> {
    const TensorView* tensor = checkpoint.Find(name);
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint lacks tensor \"", name, "\""));
    }
    if (tensor->shape != shape) {
      auto dims = [](const std::vector<int64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
        return out + "]";
      };
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" has shape ",
                                                     dims(tensor->shape), ", config.json implies ",
                                                     dims(shape)));
    }
    used.insert(name);
    return tensor;
  };

  CheckpointTensors out;
  ASSIGN_OR_RETURN(out.embed, need("model.embed_tokens.weight", {config.vocab_size, hidden}));
  if (!config.tie_word_embeddings) {
    ASSIGN_OR_RETURN(out.lm_head, need("lm_head.weight", {config.vocab_size, hidden}));
  } else {
    out.lm_head = out.embed;
    // Tied: transformers ignores a stored copy too.
    if (checkpoint.Find("lm_head.weight") != nullptr) used.insert("lm_head.weight");
  }
  ASSIGN_OR_RETURN(out.final_norm, need("model.norm.weight", {hidden}));
  out.layers.resize(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    CheckpointTensors::Layer& layer = out.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    ASSIGN_OR_RETURN(layer.input_norm, need(p + "input_layernorm.weight", {hidden}));
    ASSIGN_OR_RETURN(layer.post_norm, need(p + "post_attention_layernorm.weight", {hidden}));
    ASSIGN_OR_RETURN(layer.q, need(p + "self_attn.q_proj.weight", {q_dim, hidden}));
    ASSIGN_OR_RETURN(layer.k, need(p + "self_attn.k_proj.weight", {kv_dim, hidden}));
    ASSIGN_OR_RETURN(layer.v, need(p + "self_attn.v_proj.weight", {kv_dim, hidden}));
    if (config.qkv_bias) {
      ASSIGN_OR_RETURN(layer.q_bias, need(p + "self_attn.q_proj.bias", {q_dim}));
      ASSIGN_OR_RETURN(layer.k_bias, need(p + "self_attn.k_proj.bias", {kv_dim}));
      ASSIGN_OR_RETURN(layer.v_bias, need(p + "self_attn.v_proj.bias", {kv_dim}));
    }
    ASSIGN_OR_RETURN(layer.o, need(p + "self_attn.o_proj.weight", {hidden, q_dim}));
    ASSIGN_OR_RETURN(layer.gate, need(p + "mlp.gate_proj.weight", {ffn, hidden}));
    ASSIGN_OR_RETURN(layer.up, need(p + "mlp.up_proj.weight", {ffn, hidden}));
    ASSIGN_OR_RETURN(layer.down, need(p + "mlp.down_proj.weight", {hidden, ffn}));
  }
  for (const auto& [name, tensor] : checkpoint.tensors()) {
    if (used.count(name) == 0 && !absl::EndsWith(name, "rotary_emb.inv_freq")) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor \"", name, "\" is not used by ",
                       config.architecture_name, " as config.json describes it"));
    }
  }
  return out;
}

namespace {

const std::span<const uint8_t>* FindFile(const CheckpointFiles& files, std::string_view name) {
  auto it = files.find(name);
  return it == files.end() ? nullptr : &it->second;
}

// tokenizer.json (no larger than config.json's vocabulary) and tokenizer_config.json's chat
// template (null without one).
absl::Status LoadTokenizer(const CheckpointFiles& files, const ModelConfig& config,
                           std::unique_ptr<Tokenizer>& tokenizer,
                           std::unique_ptr<ChatTemplate>& chat_template) {
  const auto* tokenizer_file = FindFile(files, "tokenizer.json");
  if (tokenizer_file == nullptr) {
    return absl::InvalidArgumentError("checkpoint has no tokenizer.json");
  }
  const auto* tokenizer_config_file = FindFile(files, "tokenizer_config.json");
  std::string_view tokenizer_config =
      tokenizer_config_file ? AsText(*tokenizer_config_file) : std::string_view();
  ASSIGN_OR_RETURN(tokenizer, Tokenizer::Load(AsText(*tokenizer_file), tokenizer_config));
  if (tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json has ", tokenizer->vocab_size(), " tokens but config.json vocab_size is ",
        config.vocab_size));
  }
  if (tokenizer_config.empty()) return absl::OkStatus();
  nlohmann::json parsed = nlohmann::json::parse(tokenizer_config, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
  }
  absl::StatusOr<std::string> source = SelectChatTemplate(parsed, "");
  if (source.ok()) {
    ASSIGN_OR_RETURN(chat_template, ChatTemplate::Parse(*source));
  } else if (!absl::IsNotFound(source.status())) {
    return source.status();
  }
  return absl::OkStatus();
}

// Converts the norms and biases into `weights` and plans its matrices, stacked by rows from
// the tensors PlanCheckpointTensors checked.
std::vector<PlannedMatrix> PlanWeights(const CheckpointTensors& tensors, const ModelConfig& config,
                                       const LoadOptions& options, Model::Weights& weights) {
  std::vector<PlannedMatrix> plan;
  auto plan_matrix = [&](WeightMatrix* target, std::vector<const TensorView*> parts) {
    PlannedMatrix m;
    m.target = target;
    m.cols = parts[0]->shape[1];
    m.parts = std::move(parts);
    for (const TensorView* t : m.parts) m.rows += t->shape[0];
    m.dtype = m.parts[0]->dtype;
    for (const TensorView* t : m.parts) {
      if (t->dtype != m.dtype) m.dtype = DType::kF32;
    }
    if (options.weights == WeightFormat::kF32) m.dtype = DType::kF32;
    plan.push_back(std::move(m));
  };
  plan_matrix(&weights.embed, {tensors.embed});
  if (!config.tie_word_embeddings) plan_matrix(&weights.lm_head, {tensors.lm_head});
  weights.final_norm = TensorToFloat(*tensors.final_norm);
  weights.layers.resize(config.num_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    Model::Weights::Layer& layer = weights.layers[l];
    const CheckpointTensors::Layer& t = tensors.layers[l];
    layer.input_norm = TensorToFloat(*t.input_norm);
    layer.post_norm = TensorToFloat(*t.post_norm);
    plan_matrix(&layer.qkv, {t.q, t.k, t.v});
    if (t.q_bias != nullptr) {
      for (const TensorView* bias : {t.q_bias, t.k_bias, t.v_bias}) {
        std::vector<float> values = TensorToFloat(*bias);
        layer.qkv_bias.insert(layer.qkv_bias.end(), values.begin(), values.end());
      }
    }
    plan_matrix(&layer.o, {t.o});
    plan_matrix(&layer.gate_up, {t.gate, t.up});
    plan_matrix(&layer.down, {t.down});
  }
  return plan;
}

// Lays the planned matrices out in one allocation of `storage` and packs them; returns its
// size in bytes.
absl::StatusOr<size_t> PackWeights(std::vector<PlannedMatrix>& plan, const LoadOptions& options,
                                   AlignedBuffer& storage) {
  size_t total = 0;
  for (PlannedMatrix& m : plan) {
    m.offset = total;
    total += (static_cast<size_t>(WeightMatrix::PaddedRows(m.rows)) * m.cols * DTypeSize(m.dtype) +
              63) / 64 * 64;
  }
  if (options.max_weight_bytes != 0 && total > options.max_weight_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's weights need ", total,
                                                     " bytes, over the limit of ",
                                                     options.max_weight_bytes));
  }
  storage.Allocate(total);
  if (storage.data == nullptr && total != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", total, " weight bytes"));
  }
  std::memset(storage.data, 0, total);  // the panels' padding rows stay zero
  for (PlannedMatrix& m : plan) {
    uint8_t* out = storage.data + m.offset;
    *m.target = WeightMatrix{m.dtype, m.rows, m.cols, out};
    int64_t row = 0;
    for (const TensorView* part : m.parts) {
      PackRows(part->data.data(), part->dtype, part->shape[0], row, out, *m.target);
      row += part->shape[0];
    }
  }
  return total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const CheckpointFiles& files,
                                                   const LoadOptions& options) {
  const auto* config_file = FindFile(files, "config.json");
  if (config_file == nullptr) return absl::InvalidArgumentError("checkpoint has no config.json");
  const auto* generation_file = FindFile(files, "generation_config.json");
  ASSIGN_OR_RETURN(ModelConfig config,
                   ParseModelConfig(AsText(*config_file),
                                    generation_file ? AsText(*generation_file) : ""));
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  RETURN_IF_ERROR(LoadTokenizer(files, config, tokenizer, chat_template));

  ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(files));
  ASSIGN_OR_RETURN(CheckpointTensors tensors, PlanCheckpointTensors(checkpoint, config));

  auto model = std::unique_ptr<Model>(new Model());
  // Checked; another engine holds the weights.
  if (options.weights == WeightFormat::kNone) {
    model->config_ = std::move(config);
    model->tokenizer_ = std::move(tokenizer);
    model->chat_template_ = std::move(chat_template);
    return model;
  }
  auto weights = std::make_unique<Weights>();
  std::vector<PlannedMatrix> plan = PlanWeights(tensors, config, options, *weights);
  ASSIGN_OR_RETURN(const size_t total, PackWeights(plan, options, weights->storage));
  if (config.tie_word_embeddings) weights->lm_head = weights->embed;
  weights->inv_freq = RopeFrequencies(config);

  model->weight_bytes_ = total;
  model->config_ = std::move(config);
  model->tokenizer_ = std::move(tokenizer);
  model->chat_template_ = std::move(chat_template);
  model->weights_ = std::move(weights);
  return model;
}

// ---- KV cache --------------------------------------------------------------------------------

KvCache::KvCache(const ModelConfig& config, int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      layers_(config.num_layers),
      block_stride_(static_cast<size_t>(config.num_kv_heads) * block_size * config.head_dim),
      data_(static_cast<size_t>(layers_) * 2 * num_blocks * block_stride_, 0.0f) {}

size_t KvCache::bytes_per_token() const {
  return static_cast<size_t>(layers_) * 2 * (block_stride_ / block_size_) * sizeof(float);
}

void KvCache::ScrubBlock(int32_t block) {
  for (int64_t layer = 0; layer < layers_; ++layer) {
    std::memset(key(layer, block), 0, block_stride_ * sizeof(float));
    std::memset(value(layer, block), 0, block_stride_ * sizeof(float));
  }
}

// ---- forward ---------------------------------------------------------------------------------

absl::Status CheckStep(std::span<const StepSequence> parts, const ModelConfig& c,
                       int32_t num_blocks, int32_t block_size) {
  for (const StepSequence& part : parts) {
    if (part.tokens.empty()) return absl::InvalidArgumentError("a step part has no tokens");
    const int64_t last = part.start_position + static_cast<int64_t>(part.tokens.size()) - 1;
    if (part.start_position < 0 || last >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("position ", last, " is past the context of ",
                                                     c.max_position_embeddings, " tokens"));
    }
    if (last / block_size >= static_cast<int64_t>(part.block_table.size())) {
      return absl::InvalidArgumentError("a block table does not cover its positions");
    }
    for (int32_t block : part.block_table) {
      if (block < 0 || block >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("block ", block, " is not in the cache"));
      }
    }
    for (int32_t id : part.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is not below vocab_size ", c.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// One token of a step: the part it belongs to and its position.
struct StepRow {
  int32_t part;
  int64_t position;
};

// One Forward call: the model's shapes, the step flattened to one row per token, and the
// activations of every row.
struct StepPass {
  StepPass(const ModelConfig& config, std::span<const StepSequence> step_parts, KvCache& kv,
           ThreadPool& thread_pool)
      : c(config),
        parts(step_parts),
        cache(kv),
        pool(thread_pool),
        hidden(c.hidden_size),
        head_dim(c.head_dim),
        half(head_dim / 2),
        q_dim(c.num_heads * head_dim),
        kv_dim(c.num_kv_heads * head_dim),
        qkv_rows(q_dim + 2 * kv_dim),
        ffn(c.intermediate_size),
        group(c.num_heads / c.num_kv_heads),
        block_size(cache.block_size()),
        eps(static_cast<float>(c.rms_norm_eps)),
        scale(1.0f / std::sqrt(static_cast<float>(head_dim))),
        window(c.sliding_window.value_or(0)) {}

  const ModelConfig& c;
  std::span<const StepSequence> parts;
  KvCache& cache;
  ThreadPool& pool;
  const int64_t hidden, head_dim, half, q_dim, kv_dim, qkv_rows, ffn, group;
  const int32_t block_size;
  const float eps;
  const float scale;
  const int64_t window;

  std::vector<StepRow> rows;
  std::vector<int32_t> logit_rows;  // the rows whose logits are wanted
  int64_t tokens = 0;
  int64_t max_span = 1;        // the most positions one row attends to
  int64_t attention_work = 0;  // multiply-adds of scores and weighted values
  std::vector<float> x, xn, qkv, attn, gate_up, act, cos, sin;
};

// Flattens the step into rows and sizes the activations and the attention spans.
void FlattenStep(StepPass& s) {
  for (size_t p = 0; p < s.parts.size(); ++p) {
    const StepSequence& part = s.parts[p];
    for (size_t i = 0; i < part.tokens.size(); ++i) {
      s.rows.push_back({static_cast<int32_t>(p), part.start_position + static_cast<int64_t>(i)});
    }
    if (part.want_logits) s.logit_rows.push_back(static_cast<int32_t>(s.rows.size() - 1));
  }
  const int64_t tokens = static_cast<int64_t>(s.rows.size());
  s.tokens = tokens;
  s.x.resize(tokens * s.hidden);
  s.xn.resize(tokens * s.hidden);
  s.qkv.resize(tokens * s.qkv_rows);
  s.attn.resize(tokens * s.q_dim);
  s.gate_up.resize(tokens * 2 * s.ffn);
  s.act.resize(tokens * s.ffn);
  s.cos.resize(tokens * s.half);
  s.sin.resize(tokens * s.half);
  for (const StepRow& row : s.rows) {
    const int64_t first = s.window > 0 ? std::max<int64_t>(0, row.position - s.window + 1) : 0;
    s.max_span = std::max(s.max_span, row.position - first + 1);
    s.attention_work += 2 * (row.position - first + 1) * s.q_dim;
  }
}

// The RoPE tables of every row and the token embeddings into x.
void EmbedStep(StepPass& s, const Model::Weights& w) {
  const int64_t tokens = s.tokens;
  const int64_t half = s.half;
  const int64_t hidden = s.hidden;
  std::vector<int32_t> token_ids(tokens);
  {
    int64_t t = 0;
    for (const StepSequence& part : s.parts)
      for (int32_t id : part.tokens) token_ids[t++] = id;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const float position = static_cast<float>(s.rows[t].position);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * w.inv_freq[i];
      s.cos[t * half + i] = std::cos(angle);
      s.sin[t * half + i] = std::sin(angle);
    }
  }
  float* x = s.x.data();
  s.pool.For(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) RowToFloat(w.embed, token_ids[t], &x[t * hidden]);
  });
}

// Bias, RoPE, and the new keys and values of layer `l` into the cache.
void RopeAndStoreKv(StepPass& s, const Model::Weights::Layer& layer, int64_t l) {
  const ModelConfig& c = s.c;
  const int64_t tokens = s.tokens, qkv_rows = s.qkv_rows, head_dim = s.head_dim, half = s.half;
  const int64_t q_dim = s.q_dim, kv_dim = s.kv_dim;
  const int32_t block_size = s.block_size;
  std::vector<float>& qkv = s.qkv;
  const std::vector<float>& cos = s.cos;
  const std::vector<float>& sin = s.sin;
  KvCache& cache = s.cache;
  s.pool.For(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = &qkv[t * qkv_rows];
      if (!layer.qkv_bias.empty()) {
        for (int64_t i = 0; i < qkv_rows; ++i) row[i] += layer.qkv_bias[i];
      }
      for (int64_t h = 0; h < c.num_heads + c.num_kv_heads; ++h) {
        ApplyRope(row + h * head_dim, &cos[t * half], &sin[t * half], half);
      }
      const StepSequence& part = s.parts[s.rows[t].part];
      const int64_t position = s.rows[t].position;
      const int32_t block = part.block_table[position / block_size];
      const int64_t slot = position % block_size;
      float* keys = cache.key(l, block);
      float* values = cache.value(l, block);
      for (int64_t g = 0; g < c.num_kv_heads; ++g) {
        std::memcpy(keys + (g * block_size + slot) * head_dim, row + q_dim + g * head_dim,
                    head_dim * sizeof(float));
        std::memcpy(values + (g * block_size + slot) * head_dim,
                    row + q_dim + kv_dim + g * head_dim, head_dim * sizeof(float));
      }
    }
  }, tokens * qkv_rows * 4);
}

// Paged attention of layer `l` for every (token, kv head) into attn.
void Attend(StepPass& s, int64_t l) {
  const ModelConfig& c = s.c;
  const int64_t group = s.group, head_dim = s.head_dim, max_span = s.max_span;
  const int64_t window = s.window, qkv_rows = s.qkv_rows, q_dim = s.q_dim;
  const int32_t block_size = s.block_size;
  const float scale = s.scale;
  KvCache& cache = s.cache;
  // Work items: (token, kv head); interleaved over threads so causal rows balance.
  const int64_t items = s.tokens * c.num_kv_heads;
  // q heads are scaled once here instead of every score (a rounding difference of one ulp).
  auto attend = [&](int thread, int n) {
    std::vector<float> scores(group * max_span);
    std::vector<float> q(group * head_dim);
    std::vector<const float*> key_blocks, value_blocks;
    for (int64_t item = thread; item < items; item += n) {
      const int64_t t = item / c.num_kv_heads;
      const int64_t g = item % c.num_kv_heads;
      const StepSequence& part = s.parts[s.rows[t].part];
      const int64_t position = s.rows[t].position;
      const int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
      const int64_t blocks = position / block_size + 1;
      key_blocks.resize(blocks);
      value_blocks.resize(blocks);
      for (int64_t b = first / block_size; b < blocks; ++b) {
        key_blocks[b] = cache.key(l, part.block_table[b]) + g * block_size * head_dim;
        value_blocks[b] = cache.value(l, part.block_table[b]) + g * block_size * head_dim;
      }
      const float* source = &s.qkv[t * qkv_rows + g * group * head_dim];
      for (int64_t i = 0; i < group * head_dim; ++i) q[i] = source[i] * scale;
      AttendPaged(q.data(), group, head_dim, key_blocks.data(), value_blocks.data(), block_size,
                  first, position, scores.data(), &s.attn[t * q_dim + g * group * head_dim]);
    }
  };
  if (s.attention_work < 2 * ThreadPool::kMinWorkPerThread || s.pool.size() == 1) {
    attend(0, 1);
  } else {
    s.pool.Run([&](int thread) { attend(thread, s.pool.size()); });
  }
}

// xn = RmsNorm(x) with `norm` for every row.
void NormRows(StepPass& s, const std::vector<float>& norm) {
  const int64_t hidden = s.hidden, tokens = s.tokens;
  const float eps = s.eps;
  float* x = s.x.data();
  float* xn = s.xn.data();
  s.pool.For(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      RmsNorm(&x[t * hidden], norm.data(), hidden, eps, &xn[t * hidden]);
    }
  }, tokens * hidden * 4);
}

// One decoder layer: attention, then the gated MLP, each added to the residual x.
void RunLayer(StepPass& s, const Model::Weights::Layer& layer, int64_t l) {
  const int64_t tokens = s.tokens, hidden = s.hidden, qkv_rows = s.qkv_rows, q_dim = s.q_dim;
  const int64_t ffn = s.ffn;
  ThreadPool& pool = s.pool;
  std::vector<float>& x = s.x;
  std::vector<float>& xn = s.xn;
  std::vector<float>& gate_up = s.gate_up;
  std::vector<float>& act = s.act;
  NormRows(s, layer.input_norm);
  pool.For(qkv_rows, 32, [&](int64_t begin, int64_t end) {
    MatMul(xn.data(), tokens, hidden, layer.qkv, begin, end, s.qkv.data(), qkv_rows, false);
  }, tokens * qkv_rows * hidden);
  RopeAndStoreKv(s, layer, l);
  Attend(s, l);
  pool.For(hidden, 32, [&](int64_t begin, int64_t end) {
    MatMul(s.attn.data(), tokens, q_dim, layer.o, begin, end, x.data(), hidden, true);
  }, tokens * hidden * q_dim);
  NormRows(s, layer.post_norm);
  pool.For(2 * ffn, 32, [&](int64_t begin, int64_t end) {
    MatMul(xn.data(), tokens, hidden, layer.gate_up, begin, end, gate_up.data(), 2 * ffn, false);
  }, tokens * 2 * ffn * hidden);
  pool.For(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      SiluMul(&gate_up[t * 2 * ffn], &gate_up[t * 2 * ffn + ffn], ffn, &act[t * ffn]);
    }
  }, tokens * ffn * 8);
  pool.For(hidden, 32, [&](int64_t begin, int64_t end) {
    MatMul(act.data(), tokens, ffn, layer.down, begin, end, x.data(), hidden, true);
  }, tokens * hidden * ffn);
}

// Final norm and the vocabulary projection, only for the rows that want logits.
void ProjectLogits(StepPass& s, const Model::Weights& w, std::vector<float>& logits) {
  const ModelConfig& c = s.c;
  const int64_t hidden = s.hidden;
  const int64_t outputs = static_cast<int64_t>(s.logit_rows.size());
  logits.resize(outputs * c.vocab_size);
  if (outputs == 0) return;
  std::vector<float> final_rows(outputs * hidden);
  for (int64_t i = 0; i < outputs; ++i) {
    RmsNorm(&s.x[s.logit_rows[i] * hidden], w.final_norm.data(), hidden, s.eps,
            &final_rows[i * hidden]);
  }
  s.pool.For(c.vocab_size, 32, [&](int64_t begin, int64_t end) {
    MatMul(final_rows.data(), outputs, hidden, w.lm_head, begin, end, logits.data(), c.vocab_size,
           false);
  }, outputs * c.vocab_size * hidden);
}

}  // namespace

absl::Status Model::Forward(std::span<const StepSequence> parts, KvCache& cache,
                            ThreadPool& pool, std::vector<float>& logits,
                            const std::atomic<bool>* interrupt) const {
  if (weights_ == nullptr) {
    return absl::FailedPreconditionError(
        "the model was loaded without host weights (another engine holds them)");
  }
  const Weights& w = *weights_;
  RETURN_IF_ERROR(CheckStep(parts, config_, cache.num_blocks(), cache.block_size()));
  StepPass pass(config_, parts, cache, pool);
  FlattenStep(pass);
  EmbedStep(pass, w);
  auto interrupted = [&] {
    return interrupt != nullptr && interrupt->load(std::memory_order_relaxed);
  };
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (interrupted()) return absl::CancelledError("the step was interrupted");
    RunLayer(pass, w.layers[l], l);
  }
  if (interrupted()) return absl::CancelledError("the step was interrupted");
  ProjectLogits(pass, w, logits);
  return absl::OkStatus();
}

}  // namespace cloister::llm
