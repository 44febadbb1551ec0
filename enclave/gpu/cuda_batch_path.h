// The device path of enclave/pcie/batch_path.h on one NVIDIA GPU: a batch's inputs cross in one
// CudaTransferPath transfer into device memory (in mode emulated, sealed on CPU threads and
// authenticated and decrypted by the GCM kernels), the CUDA executor computes on them there, its
// outputs are gathered on the device and cross back in one transfer (sealed by the kernels in
// mode emulated). Registered with the executors "cuda" and "cuda-strict" by
// cuda_registration.cc, so the enclave finds it with its executor.
//
// Threading: thread-safe (CudaTransferPath is; GatherOnDevice runs on the calling thread's
// default stream and waits for it). Ownership: buffers are leases that keep their pools alive.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "enclave/gpu/cuda_transfer.h"
#include "enclave/pcie/batch_path.h"

namespace cloister::gpu {

class CudaBatchPath final : public enclave::pcie::BatchPath {
 public:
  // FailedPrecondition without a device; InvalidArgument for bad options (as CudaTransferPath).
  static absl::StatusOr<std::unique_ptr<CudaBatchPath>> Create(
      enclave::pcie::PcieMode mode, const enclave::pcie::TransferOptions& options);

  enclave::pcie::PcieMode mode() const override { return transfer_->mode(); }
  int threads() const override { return transfer_->threads(); }
  bool executor_memory_on_device() const override { return true; }
  absl::StatusOr<enclave::pcie::PathBuffer> AcquireHostStaging(size_t size) override;
  absl::StatusOr<enclave::pcie::PathBuffer> ToDevice(ByteSpan host) override;
  absl::StatusOr<enclave::pcie::PathBuffer> GatherToDevice(
      size_t size, std::span<const enclave::pcie::GatherPiece> pieces) override;
  absl::StatusOr<enclave::pcie::PathBuffer> AcquireDeviceStaging(size_t size) override;
  absl::Status GatherOnDevice(const enclave::pcie::PathBuffer& staging,
                              std::span<const enclave::pcie::GatherPiece> pieces) override;
  absl::StatusOr<enclave::pcie::PathBuffer> ToHost(
      const enclave::pcie::PathBuffer& device) override;

  // For its statistics.
  const CudaTransferPath& transfer() const { return *transfer_; }

 private:
  explicit CudaBatchPath(std::unique_ptr<CudaTransferPath> transfer)
      : transfer_(std::move(transfer)) {}
  std::unique_ptr<CudaTransferPath> transfer_;
};

}  // namespace cloister::gpu
