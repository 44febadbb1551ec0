#include "enclave/gpu/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_memory.h"
#include "enclave/gpu/cuda_ops.h"

namespace cloister::gpu {
namespace {

class CudaExecutorImpl : public runtime::Executor {
 public:
  CudaExecutorImpl(bool allow_host_fallback) : allow_host_fallback_(allow_host_fallback) {
    RegisterCudaKernels(runtime::CpuExecutor().kernels(), allow_host_fallback, registry_);
  }
  std::string_view name() const override { return allow_host_fallback_ ? "cuda" : "cuda-strict"; }
  const runtime::KernelRegistry& kernels() const override { return registry_; }
  absl::StatusOr<std::unique_ptr<runtime::DeviceRun>> NewDeviceRun() const override {
    ASSIGN_OR_RETURN(std::shared_ptr<CudaRunState> state, CudaRunState::Create());
    return std::unique_ptr<runtime::DeviceRun>(new CudaRun(std::move(state)));
  }
  absl::StatusOr<DeviceMemory> DeviceMemoryUsage() const override {
    ASSIGN_OR_RETURN(CudaMemoryUsage usage, CurrentDeviceMemory());
    return DeviceMemory{usage.total_size, usage.used_size};
  }

 private:
  bool allow_host_fallback_;
  runtime::KernelRegistry registry_;
};

// Checks for a device once and selects device 0.
const absl::Status& DeviceReady() {
  static const absl::Status* const ready = [] {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) return new absl::Status(count.status());
    if (*count == 0) {
      return new absl::Status(
          absl::FailedPreconditionError("no CUDA device: the driver reports 0 devices"));
    }
    absl::Status selected = CudaStatus(cudaSetDevice(0), "cudaSetDevice");
    return new absl::Status(selected);
  }();
  return *ready;
}

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(error), ": ",
                     cudaGetErrorString(error)));
  }
  return count;
}

absl::StatusOr<const runtime::Executor*> CudaExecutor(bool allow_host_fallback) {
  RETURN_IF_ERROR(DeviceReady());
  if (allow_host_fallback) {
    static const CudaExecutorImpl* const executor = new CudaExecutorImpl(true);
    return executor;
  }
  static const CudaExecutorImpl* const strict = new CudaExecutorImpl(false);
  return strict;
}

}  // namespace cloister::gpu
