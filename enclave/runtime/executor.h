// The Executor is what runs a graph's kernels on one kind of hardware. Today there is the CPU
// executor (BLAS for GEMM and convolution, our own loops for the rest); a CUDA one will offer
// the same operator set and be checked against it.
//
// Threading: executors are immutable after construction and shared by every model and run.
// Ownership: CpuExecutor() returns a process-wide instance that lives forever.
#pragma once

#include <string_view>

#include "enclave/runtime/kernel.h"

namespace cloister::runtime {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string_view name() const = 0;
  // The operators this executor can run.
  virtual const KernelRegistry& kernels() const = 0;
};

// The CPU executor.
const Executor& CpuExecutor();

// Looks an executor up by name ("cpu"); NotFound for any other name.
absl::StatusOr<const Executor*> FindExecutor(std::string_view name);

// Registration of the CPU kernels, one function per source file.
void RegisterElementwiseKernels(KernelRegistry& registry);
void RegisterNeuralKernels(KernelRegistry& registry);
void RegisterTensorKernels(KernelRegistry& registry);
void RegisterReduceKernels(KernelRegistry& registry);
void RegisterControlKernels(KernelRegistry& registry);
void RegisterResizeKernels(KernelRegistry& registry);
void RegisterRecurrentKernels(KernelRegistry& registry);
void RegisterMiscKernels(KernelRegistry& registry);

}  // namespace cloister::runtime
