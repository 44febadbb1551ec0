// The device side of the emulated PCIe path: AES-256-GCM over the chunked transfer format of
// enclave/pcie/chunk_cipher.h, run by CUDA kernels (cuda_gcm_kernels.cu) on device memory. The
// CPU seals a batch, one copy moves it, and the GPU authenticates and decrypts it into device
// memory (and the reverse for outputs), as DESIGN.md section 7 asks of the `emulated` mode.
//
// Threading: a CudaGcm is thread-safe; calls on different streams run concurrently (each call
// takes its scratch from the stream-ordered allocator). Ownership: owns its device tables;
// device buffers passed in belong to the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "enclave/gpu/gcm_math.h"

namespace cloister::gpu {

class CudaGcm {
 public:
  // `key`: 32 bytes. `chunk_size`: a multiple of 16 (the PCIe path's chunk size). Needs a
  // device: FailedPrecondition without one.
  static absl::StatusOr<std::unique_ptr<CudaGcm>> Create(ByteSpan key, size_t chunk_size);
  ~CudaGcm();
  CudaGcm(const CudaGcm&) = delete;
  CudaGcm& operator=(const CudaGcm&) = delete;

  size_t chunk_size() const { return chunk_size_; }

  // Seals device `plaintext` (`size` bytes) into device `sealed` (pcie::SealedSize bytes) for
  // `direction` and `counter`, queued on `stream` (the caller synchronises).
  absl::Status Seal(uint8_t direction, uint64_t counter, const uint8_t* plaintext, size_t size,
                    uint8_t* sealed, cudaStream_t stream) const;
  // Opens device `sealed` into device `plaintext` and waits for the result. DataLoss naming the
  // first chunk that fails authentication and `what` ("to the device"); `plaintext` is zeroed
  // before that returns.
  absl::Status Open(uint8_t direction, uint64_t counter, const uint8_t* sealed, uint8_t* plaintext,
                    size_t size, cudaStream_t stream, std::string_view what) const;

 private:
  CudaGcm(size_t chunk_size) : chunk_size_(chunk_size) {}
  absl::StatusOr<gcm::Transfer> Describe(uint8_t direction, uint64_t counter, size_t size) const;
  absl::StatusOr<unsigned> Run(const gcm::Transfer& transfer, cudaStream_t stream, bool wait) const;

  const size_t chunk_size_;
  gcm::KeyMaterial key_{};
  gcm::U128* powers_ = nullptr;  // device
  uint32_t* te0_ = nullptr;      // device
  uint8_t* sbox_ = nullptr;      // device
};

}  // namespace cloister::gpu
