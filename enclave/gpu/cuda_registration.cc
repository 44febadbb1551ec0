// Registers the CUDA executors with the runtime ("cuda", "cuda-strict"; "auto" prefers them),
// each with its batch path into device memory, when this object is linked into a program
// (CMake target cloister_gpu_executor). A static initializer, so that programs choose executors
// by name without naming CUDA themselves.
#include "base/status.h"
#include "enclave/gpu/cuda_batch_path.h"
#include "enclave/gpu/cuda_executor.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/runtime/executor.h"

namespace cloister::gpu {
namespace {

[[maybe_unused]] const bool registered = [] {
  auto path = [](enclave::pcie::PcieMode mode, const enclave::pcie::TransferOptions& options)
      -> absl::StatusOr<std::unique_ptr<enclave::pcie::BatchPath>> {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBatchPath> made, CudaBatchPath::Create(mode, options));
    return std::unique_ptr<enclave::pcie::BatchPath>(std::move(made));
  };
  runtime::RegisterExecutorProvider("cuda", [] { return CudaExecutor(true); }, path);
  runtime::RegisterExecutorProvider("cuda-strict", [] { return CudaExecutor(false); }, path);
  return true;
}();

}  // namespace
}  // namespace cloister::gpu
