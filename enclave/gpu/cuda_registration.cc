// Registers the CUDA executors with the runtime ("cuda", "cuda-strict"; "auto" prefers them)
// when this object is linked into a program (CMake target cloister_gpu_executor). A static
// initializer, so that programs choose executors by name without naming CUDA themselves.
#include "enclave/gpu/cuda_executor.h"
#include "enclave/runtime/executor.h"

namespace cloister::gpu {
namespace {

[[maybe_unused]] const bool registered = [] {
  runtime::RegisterExecutorProvider("cuda", [] { return CudaExecutor(true); });
  runtime::RegisterExecutorProvider("cuda-strict", [] { return CudaExecutor(false); });
  return true;
}();

}  // namespace
}  // namespace cloister::gpu
