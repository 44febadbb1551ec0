// How much memory the CUDA device the executor runs on has and how much of it is in use (by
// every process on the device, as the driver counts), for the enclave's operator statistics.
//
// Threading: callable from any thread. Ownership: nothing is held between calls.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace cloister::gpu {

struct CudaMemoryUsage {
  uint64_t total_size = 0;
  uint64_t used_size = 0;
};

// The current device's memory (cudaMemGetInfo); the CUDA error as a Status when there is no
// usable device.
absl::StatusOr<CudaMemoryUsage> CurrentDeviceMemory();

}  // namespace cloister::gpu
