// The CUDA executor (DESIGN.md section 6): the runtime's Executor on one NVIDIA GPU, with cuBLAS
// for matrix products and our own kernels (cuda_kernels_*.cu) for the rest, a stream and pooled,
// scrubbed device memory per run state, and constants uploaded when a model loads. See
// README.md for the memory and residency rules and the operator coverage.
//
// Programs get it through runtime::FindExecutor("cuda") (or "auto"), which this target
// registers when linked in (target cloister_gpu_executor); code never names CUDA elsewhere.
//
// Threading: the executors are process-wide, immutable and thread-safe; creating them the first
// time is serialised. Ownership: they live for the whole process.
#pragma once

#include "absl/status/statusor.h"
#include "enclave/runtime/executor.h"

namespace cloister::gpu {

// The CUDA executor on device 0, created on first use. FailedPrecondition "no CUDA device: ..."
// when the driver finds none or the driver is missing (the error names the CUDA result). With
// `allow_host_fallback` false ("cuda-strict"), a node without a device kernel fails Model::Load
// naming the node and operator instead of running on the host with copies.
absl::StatusOr<const runtime::Executor*> CudaExecutor(bool allow_host_fallback = true);

// How many CUDA devices the driver reports, or why it cannot tell (no driver, no device).
absl::StatusOr<int> CudaDeviceCount();

}  // namespace cloister::gpu
