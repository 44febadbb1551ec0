#include "enclave/runtime/executor.h"

#include "absl/strings/str_cat.h"

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

}  // namespace

const Executor& CpuExecutor() {
  static const CpuExecutorImpl* const executor = new CpuExecutorImpl();
  return *executor;
}

absl::StatusOr<const Executor*> FindExecutor(std::string_view name) {
  if (name == "cpu") return &CpuExecutor();
  return absl::NotFoundError(
      absl::StrCat("unknown executor '", std::string(name), "' (available: cpu)"));
}

}  // namespace cloister::runtime
