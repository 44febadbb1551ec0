#include "enclave/gpu/cuda_gcm.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_gcm_kernels.h"
#include "enclave/pcie/chunk_cipher.h"

namespace cloister::gpu {

namespace pcie = enclave::pcie;

static_assert(gcm::kAadSize == pcie::kTransferAadSize);
static_assert(gcm::kTagSize == pcie::kChunkTagSize);

absl::StatusOr<std::unique_ptr<CudaGcm>> CudaGcm::Create(ByteSpan key, size_t chunk_size) {
  if (key.size() != 32) return absl::InvalidArgumentError("the chunk key must be 32 bytes");
  if (chunk_size == 0 || chunk_size % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device chunk size ", chunk_size, " is not a positive multiple of 16"));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device for the device side of the PCIe path");
  }
  std::unique_ptr<CudaGcm> gcm(new CudaGcm(chunk_size));
  gcm::Tables tables;
  gcm::BuildTables(&tables);
  gcm::ExpandKey(key.data(), tables, &gcm->key_);
  const uint64_t entries = gcm::PowerTableSize(chunk_size);
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&gcm->powers_), entries * sizeof(gcm::U128)),
                 "cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&gcm->te0_), sizeof(tables.te0)),
                             "cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&gcm->sbox_), sizeof(tables.sbox)),
                             "cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(gcm->te0_, tables.te0, sizeof(tables.te0), cudaMemcpyHostToDevice), "cudaMemcpy"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(gcm->sbox_, tables.sbox, sizeof(tables.sbox), cudaMemcpyHostToDevice),
                 "cudaMemcpy"));
  RETURN_IF_ERROR(
      CudaStatus(LaunchGcmPowerTable(gcm->key_, gcm->powers_, entries, nullptr), "power table"));
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "power table"));
  return gcm;
}

CudaGcm::~CudaGcm() {
  // The table of powers of H is key material: scrub it before it goes back to the driver.
  if (powers_ != nullptr) {
    cudaMemset(powers_, 0, gcm::PowerTableSize(chunk_size_) * sizeof(gcm::U128));
    cudaDeviceSynchronize();
    cudaFree(powers_);
  }
  cudaFree(te0_);
  cudaFree(sbox_);
  volatile uint8_t* key = reinterpret_cast<volatile uint8_t*>(&key_);
  for (size_t i = 0; i < sizeof(key_); ++i) key[i] = 0;
}

absl::StatusOr<gcm::Transfer> CudaGcm::Describe(uint8_t direction, uint64_t counter,
                                                size_t size) const {
  const size_t chunks = pcie::ChunkCount(size, chunk_size_);
  if (chunks > UINT32_MAX) return absl::InvalidArgumentError("transfer has too many chunks");
  gcm::Transfer t;
  t.size = size;
  t.chunk_size = chunk_size_;
  t.chunks = static_cast<uint32_t>(chunks);
  const auto nonce = pcie::ChunkNonce(direction, counter, 0);
  std::memcpy(t.nonce_prefix, nonce.data(), sizeof(t.nonce_prefix));
  const auto aad = pcie::TransferAad(size, chunks);
  std::memcpy(t.aad, aad.data(), aad.size());
  return t;
}

absl::StatusOr<unsigned> CudaGcm::Run(const gcm::Transfer& transfer, cudaStream_t stream,
                                      bool wait) const {
  const size_t sums_size = sizeof(unsigned long long) * 2 * transfer.chunks;
  void* scratch = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaMallocAsync(&scratch, sums_size + 2 * sizeof(unsigned), stream), "scratch"));
  auto* sums = static_cast<unsigned long long*>(scratch);
  auto* failures = reinterpret_cast<unsigned*>(static_cast<uint8_t*>(scratch) + sums_size);
  absl::Status launched = CudaStatus(
      LaunchGcm(transfer, key_, powers_, te0_, sbox_, sums, failures, stream), "GCM kernels");
  unsigned result[2] = {0, 0};
  if (launched.ok() && wait) {
    launched = CudaStatus(
        cudaMemcpyAsync(result, failures, sizeof(result), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  }
  // The sums are GHASH partials of ciphertext: public, but scrubbed like everything else.
  cudaMemsetAsync(scratch, 0, sums_size, stream);
  cudaFreeAsync(scratch, stream);
  RETURN_IF_ERROR(launched);
  if (wait) RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "GCM kernels"));
  return result[0] == 0 ? ~0u : result[1];
}

absl::Status CudaGcm::Seal(uint8_t direction, uint64_t counter, const uint8_t* plaintext,
                           size_t size, uint8_t* sealed, cudaStream_t stream) const {
  ASSIGN_OR_RETURN(gcm::Transfer t, Describe(direction, counter, size));
  t.in = plaintext;
  t.out = sealed;
  t.seal = true;
  return Run(t, stream, /*wait=*/false).status();
}

absl::Status CudaGcm::Open(uint8_t direction, uint64_t counter, const uint8_t* sealed,
                           uint8_t* plaintext, size_t size, cudaStream_t stream,
                           std::string_view what) const {
  ASSIGN_OR_RETURN(gcm::Transfer t, Describe(direction, counter, size));
  t.in = sealed;
  t.out = plaintext;
  t.seal = false;
  ASSIGN_OR_RETURN(const unsigned first_bad, Run(t, stream, /*wait=*/true));
  if (first_bad == ~0u) return absl::OkStatus();
  if (size > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(plaintext, 0, size, stream), "scrub"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "scrub"));
  }
  return absl::DataLossError(absl::StrCat(
      "PCIe transfer ", std::string(what), " refused: chunk ", first_bad + 1, " of ", t.chunks,
      " failed authentication on the device (the bounce buffer was modified in flight)"));
}

}  // namespace cloister::gpu
