#include "enclave/gpu/cuda_batch_path.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "base/status.h"
#include "enclave/gpu/cuda_device.h"

namespace cloister::gpu {

namespace pcie = enclave::pcie;

absl::StatusOr<std::unique_ptr<CudaBatchPath>> CudaBatchPath::Create(
    pcie::PcieMode mode, const pcie::TransferOptions& options) {
  CudaTransferOptions cuda_options;
  cuda_options.chunk_size = options.chunk_size;
  cuda_options.threads = options.threads;
  cuda_options.max_transfer_size = options.max_transfer_size;
  cuda_options.max_idle_buffers = options.max_idle_buffers;
  cuda_options.in_flight_hook_for_test = options.in_flight_hook_for_test;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaTransferPath> transfer,
                   CudaTransferPath::Create(mode, std::move(cuda_options)));
  return std::unique_ptr<CudaBatchPath>(new CudaBatchPath(std::move(transfer)));
}

absl::StatusOr<pcie::PathBuffer> CudaBatchPath::AcquireHostStaging(size_t size) {
  ASSIGN_OR_RETURN(CudaBuffer buffer, transfer_->AcquireHostStaging(size));
  return pcie::HoldLease(std::move(buffer));
}

absl::StatusOr<pcie::PathBuffer> CudaBatchPath::ToDevice(ByteSpan host) {
  ASSIGN_OR_RETURN(CudaBuffer buffer, transfer_->ToDevice(host));
  return pcie::HoldLease(std::move(buffer));
}

absl::StatusOr<pcie::PathBuffer> CudaBatchPath::GatherToDevice(
    size_t size, std::span<const pcie::GatherPiece> pieces) {
  ASSIGN_OR_RETURN(CudaBuffer buffer, transfer_->GatherToDevice(size, pieces));
  return pcie::HoldLease(std::move(buffer));
}

absl::StatusOr<pcie::PathBuffer> CudaBatchPath::AcquireDeviceStaging(size_t size) {
  ASSIGN_OR_RETURN(CudaBuffer buffer, transfer_->AcquireDeviceStaging(size));
  return pcie::HoldLease(std::move(buffer));
}

absl::Status CudaBatchPath::GatherOnDevice(const pcie::PathBuffer& staging,
                                           std::span<const pcie::GatherPiece> pieces) {
  // The sources are results of finished runs (device memory, or host memory for a node that ran
  // on the host); cudaMemcpyDefault tells them apart by address.
  const cudaStream_t stream = cudaStreamPerThread;
  for (const pcie::GatherPiece& piece : pieces) {
    RETURN_IF_ERROR(pcie::CheckGatherPiece(staging, piece));
    if (piece.size == 0) continue;
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(staging.data + piece.offset, piece.source,
                                               piece.size, cudaMemcpyDefault, stream),
                               "gathering outputs on the device"));
  }
  return CudaStatus(cudaStreamSynchronize(stream), "gathering outputs on the device");
}

absl::StatusOr<pcie::PathBuffer> CudaBatchPath::ToHost(const pcie::PathBuffer& device) {
  ASSIGN_OR_RETURN(CudaBuffer buffer, transfer_->ToHost(device.data, device.size));
  return pcie::HoldLease(std::move(buffer));
}

}  // namespace cloister::gpu
