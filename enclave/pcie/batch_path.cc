#include "enclave/pcie/batch_path.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/executor.h"

namespace cloister::enclave::pcie {

absl::Status CheckGatherPiece(const PathBuffer& staging, const GatherPiece& piece) {
  if (piece.offset <= staging.size && piece.size <= staging.size - piece.offset) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("gather of ", piece.size, " bytes at ", piece.offset,
                                          " overruns a staging buffer of ", staging.size));
}

absl::StatusOr<std::unique_ptr<HostBatchPath>> HostBatchPath::Create(
    PcieMode mode, const TransferOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<TransferPath> transfer, TransferPath::Create(mode, options));
  return std::unique_ptr<HostBatchPath>(new HostBatchPath(std::move(transfer)));
}

absl::StatusOr<PathBuffer> HostBatchPath::AcquireHostStaging(size_t size) {
  ASSIGN_OR_RETURN(StagingBuffer buffer, transfer_.AcquireHostStaging(size));
  return HoldLease(std::move(buffer));
}

absl::StatusOr<PathBuffer> HostBatchPath::ToDevice(ByteSpan host) {
  ASSIGN_OR_RETURN(StagingBuffer buffer, transfer_.ToDevice(host));
  return HoldLease(std::move(buffer));
}

absl::StatusOr<PathBuffer> HostBatchPath::GatherToDevice(size_t size,
                                                         std::span<const GatherPiece> pieces) {
  ASSIGN_OR_RETURN(StagingBuffer buffer, transfer_.GatherToDevice(size, pieces));
  return HoldLease(std::move(buffer));
}

absl::StatusOr<PathBuffer> HostBatchPath::AcquireDeviceStaging(size_t size) {
  ASSIGN_OR_RETURN(StagingBuffer buffer, transfer_.AcquireDeviceStaging(size));
  return HoldLease(std::move(buffer));
}

absl::Status HostBatchPath::GatherOnDevice(const PathBuffer& staging,
                                           std::span<const GatherPiece> pieces) {
  for (const GatherPiece& piece : pieces) {
    RETURN_IF_ERROR(CheckGatherPiece(staging, piece));
    if (piece.size > 0) std::memcpy(staging.data + piece.offset, piece.source, piece.size);
  }
  return absl::OkStatus();
}

absl::StatusOr<PathBuffer> HostBatchPath::ToHost(const PathBuffer& device) {
  ASSIGN_OR_RETURN(StagingBuffer buffer, transfer_.ToHost(device.view()));
  return HoldLease(std::move(buffer));
}

absl::StatusOr<std::unique_ptr<BatchPath>> NewBatchPath(std::string_view executor_name,
                                                        PcieMode mode,
                                                        const TransferOptions& options) {
  ASSIGN_OR_RETURN(runtime::BatchPathFactory device, runtime::FindBatchPathFactory(executor_name));
  if (device) return device(mode, options);
  ASSIGN_OR_RETURN(std::unique_ptr<HostBatchPath> host, HostBatchPath::Create(mode, options));
  return std::unique_ptr<BatchPath>(std::move(host));
}

}  // namespace cloister::enclave::pcie
