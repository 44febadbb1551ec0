// How a batch reaches the memory its executor computes in, and how its outputs come back
// (DESIGN.md section 7), as RunBatch sees it: a host staging buffer to gather the inputs into,
// one transfer to the executor's side, an executor-side buffer to gather the outputs into, one
// transfer back. Two implementations:
//
//   host path    (HostBatchPath) the executor computes in host memory (the CPU executor, or any
//                executor without a path of its own): a TransferPath, whose "device side" is the
//                enclave's own memory and, in mode emulated, its executor thread decrypts.
//   device path  registered with its device executor (runtime::RegisterExecutorProvider;
//                enclave/gpu registers one with "cuda" and "cuda-strict"): the executor-side
//                buffers are device memory, and in mode emulated the device decrypts the inputs
//                and seals the outputs.
//
// Buffers are leases: each zeroes its block (host or device) when the last holder lets go.
//
// Threading: implementations are thread-safe; several batches may cross at once. NewBatchPath
// is thread-safe. Ownership: a PathBuffer's `hold` keeps its block (and the pool it returns to)
// alive, so buffers may outlive the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "enclave/pcie/transfer_path.h"

namespace cloister::enclave::pcie {

// A leased block of staging memory: host memory, or the executor's device memory when the
// path's executor_memory_on_device() is true (then only the path's own calls and the executor's
// kernels may touch `data`).
struct PathBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> hold;  // the lease; its block is zeroed when the last copy goes

  ByteSpan view() const { return {data, size}; }
  void Release() {
    hold.reset();
    data = nullptr;
    size = 0;
  }
};

// A PathBuffer holding `lease` (a move-only buffer with data() and size(), which zeroes its
// block when destroyed), for the implementations.
template <typename Lease>
PathBuffer HoldLease(Lease lease) {
  auto held = std::make_shared<Lease>(std::move(lease));
  PathBuffer buffer;
  buffer.data = held->data();
  buffer.size = held->size();
  buffer.hold = std::move(held);
  return buffer;
}

// Internal when `piece` would write past the end of `staging` (the caller's layout is wrong).
absl::Status CheckGatherPiece(const PathBuffer& staging, const GatherPiece& piece);

class BatchPath {
 public:
  virtual ~BatchPath() = default;

  virtual PcieMode mode() const = 0;
  // CPU threads that seal and open chunks in mode emulated (1 otherwise).
  virtual int threads() const = 0;
  // True when the executor-side buffers (ToDevice's result, AcquireDeviceStaging) are device
  // memory rather than host memory.
  virtual bool executor_memory_on_device() const = 0;

  // A zeroed host buffer to gather a batch's inputs into. InvalidArgument over the path's
  // largest transfer.
  virtual absl::StatusOr<PathBuffer> AcquireHostStaging(size_t size) = 0;
  // Moves `host` to the executor's side in one transfer. Emulated: DataLoss when a chunk fails
  // authentication, and nothing is delivered.
  virtual absl::StatusOr<PathBuffer> ToDevice(ByteSpan host) = 0;
  // The same for a batch of `size` bytes given as pieces in host memory (gaps are zeros), moved
  // with no host staging buffer where the path can seal straight from them. Also Internal for
  // pieces out of order, overlapping or past `size` (CheckGatherPieces).
  virtual absl::StatusOr<PathBuffer> GatherToDevice(size_t size,
                                                    std::span<const GatherPiece> pieces) = 0;
  // A zeroed executor-side buffer to gather a batch's outputs into.
  virtual absl::StatusOr<PathBuffer> AcquireDeviceStaging(size_t size) = 0;
  // Copies each piece into `staging` (from AcquireDeviceStaging) and returns once all are there.
  // Sources may be host memory or the executor's memory, and must not be written meanwhile.
  virtual absl::Status GatherOnDevice(const PathBuffer& staging,
                                      std::span<const GatherPiece> pieces) = 0;
  // Moves an executor-side buffer back to host memory in one transfer. Same errors as ToDevice.
  virtual absl::StatusOr<PathBuffer> ToHost(const PathBuffer& device) = 0;
};

// The host path over a TransferPath: one of its own (Create), or `transfer`, which must outlive
// it.
class HostBatchPath final : public BatchPath {
 public:
  // TransferPath::Create's errors.
  static absl::StatusOr<std::unique_ptr<HostBatchPath>> Create(PcieMode mode,
                                                               const TransferOptions& options);
  explicit HostBatchPath(TransferPath& transfer) : transfer_(transfer) {}

  PcieMode mode() const override { return transfer_.mode(); }
  int threads() const override { return transfer_.threads(); }
  bool executor_memory_on_device() const override { return false; }
  absl::StatusOr<PathBuffer> AcquireHostStaging(size_t size) override;
  absl::StatusOr<PathBuffer> ToDevice(ByteSpan host) override;
  absl::StatusOr<PathBuffer> GatherToDevice(size_t size,
                                            std::span<const GatherPiece> pieces) override;
  absl::StatusOr<PathBuffer> AcquireDeviceStaging(size_t size) override;
  absl::Status GatherOnDevice(const PathBuffer& staging,
                              std::span<const GatherPiece> pieces) override;
  absl::StatusOr<PathBuffer> ToHost(const PathBuffer& device) override;

  // For its statistics, and for the LLM steps that cross the same path (step_transfer.h).
  const TransferPath& transfer() const { return transfer_; }
  TransferPath& transfer() { return transfer_; }

 private:
  explicit HostBatchPath(std::unique_ptr<TransferPath> owned)
      : owned_(std::move(owned)), transfer_(*owned_) {}

  std::unique_ptr<TransferPath> owned_;  // null when borrowed
  TransferPath& transfer_;
};

// The path batches for the executor named `executor_name` (runtime::Executor::name()) take: the
// batch path registered with that executor (runtime::FindBatchPathFactory) when it has one, else
// a HostBatchPath over a TransferPath of its own (made only then, so a device executor starts no
// idle host cipher threads). NotFound for a name no executor is registered under; the device
// path's own errors (FailedPrecondition without the device).
absl::StatusOr<std::unique_ptr<BatchPath>> NewBatchPath(std::string_view executor_name,
                                                        PcieMode mode,
                                                        const TransferOptions& options);

}  // namespace cloister::enclave::pcie
