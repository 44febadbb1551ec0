// The PCIe path of DESIGN.md section 7 on a real GPU: a batch gathered in one pinned host buffer
// moves to device memory in one transfer, and its outputs come back in one.
//
//   off       one cudaMemcpy each way (plaintext on the bus; baselines only).
//   driver    the same copy: on a confidential GPU the driver encrypts its bounce buffers.
//   emulated  CPU threads seal the batch (chunk_cipher.h) into a pinned bounce buffer, one copy
//             moves the ciphertext, and CUDA kernels authenticate and decrypt it into device
//             memory (cuda_gcm.h); outputs are sealed by the kernels, copied back and opened by
//             the CPU threads. A chunk that fails authentication on either side refuses the
//             whole transfer with DataLoss, and its destination is scrubbed, never returned.
//
// Buffers come from pools (pinned host blocks from cudaHostAlloc, device blocks from
// cudaMalloc) and are zeroed before a block is reused or freed.
//
// Threading: thread-safe; each call runs on the calling thread's default stream
// (cudaStreamPerThread). Ownership: buffers are leases that keep their pool alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "enclave/pcie/transfer_path.h"

namespace cloister::gpu {

namespace internal {
struct CudaPool;
}

// A lease on a pooled block: pinned host memory or device memory.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  ~CudaBuffer() { Release(); }
  CudaBuffer(CudaBuffer&& other) noexcept;
  CudaBuffer& operator=(CudaBuffer&& other) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Host buffers only.
  std::span<uint8_t> span() const { return {data_, size_}; }
  ByteSpan view() const { return {data_, size_}; }
  bool valid() const { return pool_ != nullptr; }
  // Zeroes the block and returns it to its pool.
  void Release();

 private:
  friend struct internal::CudaPool;
  std::shared_ptr<internal::CudaPool> pool_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

struct CudaTransferOptions {
  size_t chunk_size = enclave::pcie::kEmulatedChunkSize;  // a multiple of 16, 4 KiB..64 MiB
  int threads = 0;                                        // CPU sealing threads; 0: up to 8
  size_t max_transfer_size = size_t{1} << 30;
  size_t max_idle_buffers = 8;  // per pool
  // Emulated mode: sees the pinned ciphertext between sealing and the copy to the device (and
  // between the copy back and opening), as a host that tampers with memory in flight would.
  std::function<void(std::span<uint8_t>)> in_flight_hook_for_test;
};

class CudaTransferPath {
 public:
  // FailedPrecondition without a device; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<CudaTransferPath>> Create(enclave::pcie::PcieMode mode,
                                                                  CudaTransferOptions options = {});
  ~CudaTransferPath();
  CudaTransferPath(const CudaTransferPath&) = delete;
  CudaTransferPath& operator=(const CudaTransferPath&) = delete;

  enclave::pcie::PcieMode mode() const { return mode_; }
  // CPU threads that seal and open chunks in mode emulated (1 otherwise).
  int threads() const;

  // A zeroed pinned host buffer to gather a batch into.
  absl::StatusOr<CudaBuffer> AcquireHostStaging(size_t size);
  // A zeroed device buffer to gather a batch's outputs into before ToHost.
  absl::StatusOr<CudaBuffer> AcquireDeviceStaging(size_t size);
  // `host` (best in a buffer from AcquireHostStaging) into device memory, in one transfer.
  absl::StatusOr<CudaBuffer> ToDevice(ByteSpan host);
  // A transfer of `size` bytes given as pieces in host memory (gaps are zeros). Emulated: sealed
  // straight from the pieces into the pinned ciphertext; otherwise gathered into a pinned
  // staging buffer first (a copy over PCIe wants one pinned source). Also Internal for pieces
  // out of order, overlapping or past `size`.
  absl::StatusOr<CudaBuffer> GatherToDevice(size_t size,
                                            std::span<const enclave::pcie::GatherPiece> pieces);
  // `size` bytes of device memory at `device` back into a pinned host buffer, in one transfer.
  absl::StatusOr<CudaBuffer> ToHost(const uint8_t* device, size_t size);

  struct Stats {
    uint64_t to_device_transfers = 0, to_host_transfers = 0;
    uint64_t to_device_size = 0, to_host_size = 0;
    uint64_t authentication_failures = 0;
  };
  Stats stats() const;

 private:
  struct State;
  explicit CudaTransferPath(std::unique_ptr<State> state);
  // ToDevice's work: emulated mode seals `pieces`; the other modes copy `contiguous`, which
  // holds the same `size` bytes.
  absl::StatusOr<CudaBuffer> Send(size_t size, std::span<const enclave::pcie::GatherPiece> pieces,
                                  ByteSpan contiguous);
  enclave::pcie::PcieMode mode_;
  std::unique_ptr<State> state_;
};

}  // namespace cloister::gpu
