// Model: a decoder-only transformer loaded from a Hugging Face checkpoint (config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, safetensors) held in memory,
// with its tokenizer and chat template. Forward() runs one engine step: any mix of sequences,
// each contributing a run of consecutive tokens (a decode token or a prefill chunk), against a
// paged KV cache, and writes the logits of the positions asked for. Semantics are those of
// Hugging Face transformers' modelling code: RMSNorm in float32, rotate-half RoPE (with llama3
// scaling), grouped-query attention, SiLU-gated MLP; activations are float32 (the reference
// precision), weights are kept as stored (BF16/F16) or as float32.
//
// Threading: a loaded Model is immutable; Forward may be called from one thread at a time per
// KvCache (the cache is the mutable state). Forward uses the ThreadPool it is given.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "enclave/llm/model_config.h"
#include "enclave/llm/safetensors.h"
#include "enclave/llm/thread_pool.h"
#include "enclave/llm/tokenizer.h"

namespace cloister::llm {

class ChatTemplate;

// A checkpoint's files by member name ("config.json", "model.safetensors", ...).
using CheckpointFiles = std::map<std::string, std::span<const uint8_t>, std::less<>>;

enum class WeightFormat {
  kAsStored,  // BF16 and F16 stay 16-bit (converted in the kernels), F32 stays F32
  kF32,       // every weight upcast to float32 at load
  kNone,      // checked but not kept: another engine (the CUDA one) holds the weights
};

struct LoadOptions {
  WeightFormat weights = WeightFormat::kAsStored;
  // Refuses the load before any allocation when the weights would need more (0: no limit).
  size_t max_weight_bytes = 0;
};

// The KV cache: `num_blocks` blocks of `block_size` token slots for every layer's keys and
// values (float32). Blocks are handed to sequences by the caller (BlockManager); freed blocks
// are scrubbed by ScrubBlock before reuse.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int32_t num_blocks, int32_t block_size);
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Bytes of keys and values one token takes over all layers.
  size_t bytes_per_token() const;
  size_t size() const { return data_.size() * sizeof(float); }
  void ScrubBlock(int32_t block);

  // [layer][block][kv_head][slot][head_dim] for keys, then the same for values.
  float* key(int64_t layer, int32_t block) {
    return data_.data() + ((layer * 2) * num_blocks_ + block) * block_stride_;
  }
  float* value(int64_t layer, int32_t block) {
    return data_.data() + ((layer * 2 + 1) * num_blocks_ + block) * block_stride_;
  }

 private:
  int32_t num_blocks_;
  int32_t block_size_;
  int64_t layers_;
  size_t block_stride_;  // floats per block per layer and kind: kv_heads * block_size * head_dim
  std::vector<float> data_;
};

// One sequence's part of a step: `tokens` at positions start_position .. start_position+n-1.
// The block table must already cover every position up to the last one.
struct StepSequence {
  std::span<const int32_t> tokens;
  int64_t start_position = 0;
  std::span<const int32_t> block_table;
  // Whether to compute the logits of this part's last token (a prefill chunk that is not the
  // prompt's last one needs none).
  bool want_logits = true;
  // With want_logits: an engine may return the argmax id (ties to the lowest id, NaN as
  // -infinity) instead of the logits. Set for greedy decoding without penalties or logprobs.
  bool argmax = false;
};

// Checks a step's parts against the model and a cache of `num_blocks` blocks: tokens present
// and in the vocabulary, positions inside the context, block tables covering them with blocks
// of the cache. InvalidArgument with one line naming what was wrong.
absl::Status CheckStep(std::span<const StepSequence> parts, const ModelConfig& config,
                       int32_t num_blocks, int32_t block_size);

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const CheckpointFiles& files,
                                                     const LoadOptions& options);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null when tokenizer_config.json has no chat template.
  const ChatTemplate* chat_template() const { return chat_template_.get(); }
  // Bytes the weights occupy in memory, and the bytes one decode step reads from them.
  size_t weight_bytes() const { return weight_bytes_; }

  // Runs the step. `logits` receives vocab_size floats for each part with want_logits, in order.
  // With `interrupt`, the step gives up between layers once the flag is set: Cancelled, having
  // written keys and values only at the parts' own new positions, which the next step over
  // them writes again.
  absl::Status Forward(std::span<const StepSequence> parts, KvCache& cache, ThreadPool& pool,
                       std::vector<float>& logits,
                       const std::atomic<bool>* interrupt = nullptr) const;

  struct Weights;

 private:
  Model();
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<Weights> weights_;
  size_t weight_bytes_ = 0;
};

// The checkpoint's tensors for the architecture config.json describes: every name, shape and
// (float) type checked, and a stored tensor the architecture does not use refused, before
// anything is allocated. Views into the checkpoint's bytes. Biases are null without qkv_bias;
// lm_head is embed when the embeddings are tied.
struct CheckpointTensors {
  struct Layer {
    const TensorView* input_norm = nullptr;
    const TensorView* post_norm = nullptr;
    const TensorView* q = nullptr;  // [heads * head_dim, hidden]
    const TensorView* k = nullptr;  // [kv_heads * head_dim, hidden]
    const TensorView* v = nullptr;
    const TensorView* q_bias = nullptr;
    const TensorView* k_bias = nullptr;
    const TensorView* v_bias = nullptr;
    const TensorView* o = nullptr;     // [hidden, heads * head_dim]
    const TensorView* gate = nullptr;  // [intermediate, hidden]
    const TensorView* up = nullptr;
    const TensorView* down = nullptr;  // [hidden, intermediate]
  };
  const TensorView* embed = nullptr;  // [vocab, hidden]
  const TensorView* lm_head = nullptr;
  const TensorView* final_norm = nullptr;
  std::vector<Layer> layers;
};
absl::StatusOr<CheckpointTensors> PlanCheckpointTensors(const Checkpoint& checkpoint,
                                                        const ModelConfig& config);

// A tensor's elements as float32.
std::vector<float> TensorToFloat(const TensorView& tensor);

// The head_dim / 2 RoPE inverse frequencies as transformers computes them in float32, with the
// llama3 rescaling of long wavelengths where configured.
std::vector<float> RopeFrequencies(const ModelConfig& config);

// Reads a checkpoint folder's files (config.json, tokenizer files, safetensors) into `storage`
// and returns views of them, for offline tools and tests.
absl::StatusOr<CheckpointFiles> ReadCheckpointDir(const std::string& dir,
                                                  std::vector<std::string>& storage);

}  // namespace cloister::llm
