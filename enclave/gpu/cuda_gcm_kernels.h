// Launchers for the device side of the emulated PCIe path (cuda_gcm_kernels.cu): AES-256-GCM over
// the chunked transfer format, with the arithmetic of gcm_math.h. Plain C++ (no absl) so that
// nvcc compiles it alone; cuda_gcm.h wraps it with Status and memory.
//
// Threading: stateless; work is ordered by the stream passed in.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "enclave/gpu/gcm_math.h"

namespace cloister::gpu {

// Fills powers[0..entries) with H^k (entry 0 zero).
cudaError_t LaunchGcmPowerTable(const gcm::KeyMaterial& key, gcm::U128* powers, uint64_t entries,
                                cudaStream_t stream);

// Seals or opens transfer `t` (device pointers). `sums` is scratch of 2 * t.chunks words;
// `failures` two words: the count of chunks whose tag did not match and the lowest such chunk
// (0xffffffff when none), written by the device. Both are initialised here.
cudaError_t LaunchGcm(const gcm::Transfer& t, const gcm::KeyMaterial& key, const gcm::U128* powers,
                      const uint32_t* te0, const uint8_t* sbox, unsigned long long* sums,
                      unsigned int* failures, cudaStream_t stream);

}  // namespace cloister::gpu
