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
    RegisterElementwiseKernels(registry_);
    RegisterNeuralKernels(registry_);
    RegisterTensorKernels(registry_);
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

struct ProviderRegistry {
  absl::Mutex mutex;
  std::map<std::string, ExecutorProvider, std::less<>> providers ABSL_GUARDED_BY(mutex);
};

ProviderRegistry& Providers() {
  static ProviderRegistry* const registry = new ProviderRegistry();
  return *registry;
}

}  // namespace

const Executor& CpuExecutor() {
  static const CpuExecutorImpl* const executor = new CpuExecutorImpl();
  return *executor;
}

void RegisterExecutorProvider(std::string name, ExecutorProvider provider) {
  ProviderRegistry& registry = Providers();
  absl::MutexLock lock(&registry.mutex);
  registry.providers[std::move(name)] = provider;
}

absl::StatusOr<const Executor*> FindExecutor(std::string_view name) {
  if (name == "cpu") return &CpuExecutor();
  std::vector<std::pair<std::string, ExecutorProvider>> providers;
  {
    ProviderRegistry& registry = Providers();
    absl::MutexLock lock(&registry.mutex);
    providers.assign(registry.providers.begin(), registry.providers.end());
  }
  if (name == "auto") {
    for (const auto& entry : providers) {
      absl::StatusOr<const Executor*> executor = entry.second();
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
  std::vector<std::string> names = {"cpu"};
  for (const auto& entry : providers) {
    if (entry.first == name) return entry.second();
    names.push_back(entry.first);
  }
  return absl::NotFoundError(
      absl::StrCat("unknown executor '", std::string(name),
                   "' (available in this build: ", absl::StrJoin(names, ", "), ", auto)"));
}

}  // namespace cloister::runtime
