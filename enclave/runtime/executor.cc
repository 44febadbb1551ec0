#include "enclave/runtime/executor.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"

namespace cloister::runtime {
namespace {

class CpuExecutorImpl : public Executor {
 public:
  CpuExecutorImpl() {
    RegisterUnaryKernels(registry_);
    RegisterElementwiseKernels(registry_);
    RegisterCastKernels(registry_);
    RegisterConvKernels(registry_);
    RegisterNeuralKernels(registry_);
    RegisterMatMulKernels(registry_);
    RegisterTensorKernels(registry_);
    RegisterLayoutKernels(registry_);
    RegisterSliceKernels(registry_);
    RegisterReduceKernels(registry_);
    RegisterControlKernels(registry_);
    RegisterResizeKernels(registry_);
    RegisterRecurrentKernels(registry_);
    RegisterMiscKernels(registry_);
  }
  std::string_view name() const override { return "cpu"; }
  const KernelRegistry& kernels() const override { return registry_; }

 private:
  KernelRegistry registry_;
};

// What one registration holds: the executor and, for a device executor, its batch path.
struct Registration {
  ExecutorProvider provider = nullptr;
  BatchPathFactory batch_path;
};

struct ProviderRegistry {
  absl::Mutex mutex;
  std::map<std::string, Registration, std::less<>> providers ABSL_GUARDED_BY(mutex);
};

ProviderRegistry& Providers() {
  static ProviderRegistry* const registry = new ProviderRegistry();
  return *registry;
}

std::vector<std::pair<std::string, Registration>> Registrations() {
  ProviderRegistry& registry = Providers();
  absl::MutexLock lock(&registry.mutex);
  return {registry.providers.begin(), registry.providers.end()};
}

absl::Status UnknownExecutor(std::string_view name,
                             const std::vector<std::pair<std::string, Registration>>& providers) {
  std::vector<std::string> names = {"cpu"};
  for (const auto& entry : providers) names.push_back(entry.first);
  return absl::NotFoundError(
      absl::StrCat("unknown executor '", std::string(name),
                   "' (available in this build: ", absl::StrJoin(names, ", "), ", auto)"));
}

}  // namespace

const Executor& CpuExecutor() {
  static const CpuExecutorImpl* const executor = new CpuExecutorImpl();
  return *executor;
}

void RegisterExecutorProvider(std::string name, ExecutorProvider provider,
                              BatchPathFactory batch_path) {
  ProviderRegistry& registry = Providers();
  absl::MutexLock lock(&registry.mutex);
  registry.providers[std::move(name)] = {provider, std::move(batch_path)};
}

absl::StatusOr<const Executor*> FindExecutor(std::string_view name) {
  if (name == "cpu") return &CpuExecutor();
  const std::vector<std::pair<std::string, Registration>> providers = Registrations();
  if (name == "auto") {
    for (const auto& entry : providers) {
      absl::StatusOr<const Executor*> executor = entry.second.provider();
      if (executor.ok()) return executor;
      static const bool logged = [&] {
        Log(LogLevel::kInfo, "executor_fallback",
            {{"executor", entry.first},
             {"reason", std::string(executor.status().message())},
             {"using", "cpu"}});
        return true;
      }();
      (void)logged;
    }
    return &CpuExecutor();
  }
  for (const auto& entry : providers) {
    if (entry.first == name) return entry.second.provider();
  }
  return UnknownExecutor(name, providers);
}

absl::StatusOr<BatchPathFactory> FindBatchPathFactory(std::string_view name) {
  if (name == "cpu") return BatchPathFactory();
  const std::vector<std::pair<std::string, Registration>> providers = Registrations();
  for (const auto& entry : providers) {
    if (entry.first == name) return entry.second.batch_path;
  }
  return UnknownExecutor(name, providers);
}

}  // namespace cloister::runtime
