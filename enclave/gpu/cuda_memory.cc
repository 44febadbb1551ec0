#include "enclave/gpu/cuda_memory.h"

#include <cuda_runtime_api.h>

#include <cstddef>

#include "enclave/gpu/cuda_device.h"

namespace cloister::gpu {

absl::StatusOr<CudaMemoryUsage> CurrentDeviceMemory() {
  size_t free_size = 0;
  size_t total_size = 0;
  absl::Status status = CudaStatus(cudaMemGetInfo(&free_size, &total_size), "cudaMemGetInfo");
  if (!status.ok()) return status;
  CudaMemoryUsage usage;
  usage.total_size = total_size;
  usage.used_size = total_size >= free_size ? total_size - free_size : 0;
  return usage;
}

}  // namespace cloister::gpu
