// StepEngine: where a Generator's steps run. An engine owns a paged KV cache and runs the
// forward pass of one step (Model::Forward's contract) over it; for parts that allow it
// (greedy decoding without penalties or log-probabilities) it may also pick the token itself,
// so that a device engine sends back only token ids. The CPU engine is always present; the
// CUDA engine (enclave/gpu/llm) registers itself under "cuda" when its library is linked.
//
// Threading: an engine is driven by one thread at a time (its Generator's). The registry is
// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "enclave/llm/model.h"

namespace cloister::llm {

// Activation precision of a device engine's matrix products.
enum class Precision {
  kF32,   // float32 throughout (the references' precision)
  kBf16,  // the weights as stored (BF16/F16) times 16-bit activations, float32 accumulation
};
absl::StatusOr<Precision> ParsePrecision(std::string_view name);  // "f32" | "bf16"

struct StepResult {
  // One entry per part with want_logits, in order: the id the engine chose (parts with argmax
  // set, where the engine chooses), else -1, and that part's logits follow in `logits`.
  std::vector<int32_t> ids;
  std::vector<float> logits;  // vocab_size floats for each -1 in ids, in order
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual std::string_view name() const = 0;
  virtual int32_t num_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  // Bytes of keys and values one token takes over all layers, and the whole cache.
  virtual size_t kv_bytes_per_token() const = 0;
  virtual size_t kv_bytes() const = 0;
  // Bytes the weights take in the engine's memory (read once per step by the matrix products).
  virtual size_t weight_bytes() const = 0;
  // Zeroes a freed block's keys and values before it is reused.
  virtual void ScrubBlock(int32_t block) = 0;
  // Runs one step (see StepSequence). Errors name the part that was wrong; nothing in the cache
  // outside the parts' own blocks changes.
  virtual absl::Status Step(std::span<const StepSequence> parts, StepResult& result) = 0;
  // The flag the next steps watch (null: none): an engine that can, gives a step up part-way
  // once it is set and returns Cancelled (Model::Forward's contract). Engines that cannot
  // ignore it and finish their steps.
  virtual void SetInterrupt(const std::atomic<bool>* flag) {}
};

// A StepEngine that passes every call to `inner`: a wrapper (a step's transfers, a test's
// records) derives from it and overrides only what it adds.
class ForwardingEngine : public StepEngine {
 public:
  explicit ForwardingEngine(std::unique_ptr<StepEngine> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  int32_t num_blocks() const override { return inner_->num_blocks(); }
  int32_t block_size() const override { return inner_->block_size(); }
  size_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  size_t kv_bytes() const override { return inner_->kv_bytes(); }
  size_t weight_bytes() const override { return inner_->weight_bytes(); }
  void ScrubBlock(int32_t block) override { inner_->ScrubBlock(block); }
  absl::Status Step(std::span<const StepSequence> parts, StepResult& result) override {
    return inner_->Step(parts, result);
  }
  void SetInterrupt(const std::atomic<bool>* flag) override { inner_->SetInterrupt(flag); }

 protected:
  StepEngine& inner() { return *inner_; }

 private:
  std::unique_ptr<StepEngine> inner_;
};

struct EngineOptions {
  std::string executor = "cpu";  // "cpu", "cuda", or "auto" (cuda where it runs, else cpu)
  int32_t threads = 1;           // the CPU engine's thread pool
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  Precision precision = Precision::kF32;  // device engines; the CPU engine is float32
};

// The CPU engine over `model` (loaded with host weights), which must outlive it.
absl::StatusOr<std::unique_ptr<StepEngine>> MakeCpuEngine(const Model& model,
                                                          const EngineOptions& options);

// A device engine: whether it can run here (a device is present) and how to make one. The
// factory gets the checkpoint's files (for the weights) besides the model (config, tokenizer).
struct EngineBackend {
  std::function<absl::Status()> available;
  std::function<absl::StatusOr<std::unique_ptr<StepEngine>>(
      const Model& model, const CheckpointFiles& files, const EngineOptions& options)>
      create;
  // The memory read bandwidth of the engine's device in bytes/s, for benchmarks.
  std::function<absl::StatusOr<double>()> read_bandwidth;
};
void RegisterEngineBackend(std::string name, EngineBackend backend);

// "cpu" stays "cpu"; "auto" becomes "cuda" where that backend is registered and available,
// else "cpu"; another name must be registered and available. Errors are one line:
// "executor \"cuda\" is not in this build (cpu)" or the backend's own reason.
absl::StatusOr<std::string> ResolveExecutor(std::string_view executor);

// Makes the engine options.executor names (resolved as above). The CPU engine needs `model`
// loaded with host weights; a device engine reads the weights from `files`, so a caller that
// knows the executor is not the CPU loads the model with WeightFormat::kNone.
absl::StatusOr<std::unique_ptr<StepEngine>> CreateEngine(const Model& model,
                                                         const CheckpointFiles& files,
                                                         const EngineOptions& options);

// The registered backend's read_bandwidth (not for "cpu": benchmarks measure the host's).
absl::StatusOr<double> EngineReadBandwidth(std::string_view executor);

}  // namespace cloister::llm
