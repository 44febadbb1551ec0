#include "enclave/llm/engine.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "enclave/llm/sampler.h"
#include "enclave/llm/thread_pool.h"

namespace cloister::llm {

absl::StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("precision \"", std::string(name), "\" is not one of f32, bf16"));
}

namespace {

class CpuEngine : public StepEngine {
 public:
  CpuEngine(const Model& model, const EngineOptions& options)
      : model_(model),
        pool_(options.threads),
        cache_(model.config(), options.num_blocks, options.block_size) {}

  std::string_view name() const override { return "cpu"; }
  int32_t num_blocks() const override { return cache_.num_blocks(); }
  int32_t block_size() const override { return cache_.block_size(); }
  size_t kv_bytes_per_token() const override { return cache_.bytes_per_token(); }
  size_t kv_bytes() const override { return cache_.size(); }
  size_t weight_bytes() const override { return model_.weight_bytes(); }
  void ScrubBlock(int32_t block) override { cache_.ScrubBlock(block); }

  absl::Status Step(std::span<const StepSequence> parts, StepResult& result) override {
    RETURN_IF_ERROR(model_.Forward(parts, cache_, pool_, result.logits, interrupt_));
    // Plain greedy parts get their argmax here (GreedyId, the Sampler's own greedy choice), as a
    // device engine picks them, so that only their ids come back: a step's
    // results crossing the PCIe path are then its ids, not a logits row per sequence (at 8
    // sequences of a 2 k vocabulary, 64 KiB to seal and open every step).
    const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
    result.ids.clear();
    size_t row = 0, kept = 0;
    for (const StepSequence& part : parts) {
      if (!part.want_logits) continue;
      float* logits = result.logits.data() + row * vocab;
      ++row;
      if (part.argmax) {
        result.ids.push_back(GreedyId(std::span<const float>(logits, vocab)));
        continue;
      }
      result.ids.push_back(-1);
      if (kept + 1 != row) {
        std::memmove(result.logits.data() + kept * vocab, logits, vocab * sizeof(float));
      }
      ++kept;
    }
    result.logits.resize(kept * vocab);
    return absl::OkStatus();
  }
  void SetInterrupt(const std::atomic<bool>* flag) override { interrupt_ = flag; }

 private:
  const Model& model_;
  ThreadPool pool_;
  KvCache cache_;
  const std::atomic<bool>* interrupt_ = nullptr;
};

struct Registry {
  absl::Mutex mutex;
  std::map<std::string, EngineBackend, std::less<>> backends ABSL_GUARDED_BY(mutex);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: static initializers use it
  return *registry;
}

absl::StatusOr<EngineBackend> FindBackend(std::string_view name) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mutex);
  auto it = registry.backends.find(name);
  if (it == registry.backends.end()) {
    std::string known = "cpu";
    for (const auto& [other, backend] : registry.backends) absl::StrAppend(&known, ", ", other);
    return absl::NotFoundError(absl::StrCat("executor \"", std::string(name),
                                            "\" is not in this build (", known, ")"));
  }
  return it->second;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepEngine>> MakeCpuEngine(const Model& model,
                                                          const EngineOptions& options) {
  if (options.threads < 1 || options.num_blocks < 1 || options.block_size < 1) {
    return absl::InvalidArgumentError("threads, num_blocks and block_size must be at least 1");
  }
  if (model.weight_bytes() == 0) {
    return absl::FailedPreconditionError(
        "the CPU engine needs the model loaded with host weights");
  }
  return std::unique_ptr<StepEngine>(new CpuEngine(model, options));
}

void RegisterEngineBackend(std::string name, EngineBackend backend) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mutex);
  registry.backends[std::move(name)] = std::move(backend);
}

absl::StatusOr<std::string> ResolveExecutor(std::string_view executor) {
  if (executor == "cpu") return std::string("cpu");
  if (executor == "auto") {
    absl::StatusOr<EngineBackend> cuda = FindBackend("cuda");
    if (cuda.ok() && cuda->available().ok()) return std::string("cuda");
    return std::string("cpu");
  }
  ASSIGN_OR_RETURN(EngineBackend backend, FindBackend(executor));
  RETURN_IF_ERROR(backend.available());
  return std::string(executor);
}

absl::StatusOr<std::unique_ptr<StepEngine>> CreateEngine(const Model& model,
                                                         const CheckpointFiles& files,
                                                         const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::string executor, ResolveExecutor(options.executor));
  if (executor == "cpu") return MakeCpuEngine(model, options);
  ASSIGN_OR_RETURN(EngineBackend backend, FindBackend(executor));
  return backend.create(model, files, options);
}

absl::StatusOr<double> EngineReadBandwidth(std::string_view executor) {
  ASSIGN_OR_RETURN(EngineBackend backend, FindBackend(executor));
  RETURN_IF_ERROR(backend.available());
  if (!backend.read_bandwidth) {
    return absl::UnimplementedError(
        absl::StrCat("executor \"", std::string(executor), "\" has no bandwidth probe"));
  }
  return backend.read_bandwidth();
}

}  // namespace cloister::llm
