// The CPU-GPU (PCIe) path of DESIGN.md section 7: a whole batch is moved to the executor's side
// in one transfer (sealed straight from the requests' bytes, or from one staging buffer), and
// its outputs come back the same way. Three modes:
//
//   off       a plain copy. Plaintext on the bus: for baselines only (a production policy
//             refuses it).
//   driver    a real confidential GPU: the GPU driver encrypts its bounce buffers itself, so our
//             code makes a plain copy into pinned memory and leaves the rest to the driver.
//   emulated  no CC hardware: the sender encrypts the staging buffer with AES-256-GCM in chunks
//             (2 MiB by default) on a pool of CPU threads into a bounce buffer, and the
//             receiving side authenticates and decrypts it into its own buffer. Each chunk's
//             nonce is direction || 56-bit per-direction transfer counter || 32-bit chunk
//             index; the associated data binds the transfer's size and chunk count, so a
//             modified, reordered, truncated or replayed chunk fails authentication and the
//             transfer is refused with nothing delivered (format: chunk_cipher.h). On a CPU-only
//             machine the "device side" is the executor's thread (helped by the same thread pool,
//             standing in for the GPU's parallel decryption), and the key stands in for the session
//             key a CC GPU agrees with its driver.
//
// All buffers (host staging, bounce, device side) come from pools of pinned blocks that are
// zeroed whenever a lease ends (staging_pool.h).
//
// Threading: a TransferPath is thread-safe; ToDevice/ToHost may run on many threads at once
// (their chunks share the path's thread pool). Ownership: the buffers returned are leases that
// may outlive the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "enclave/pcie/chunk_cipher.h"
#include "enclave/pcie/staging_pool.h"

namespace cloister::enclave::pcie {

enum class PcieMode { kOff, kDriver, kEmulated };

// "off", "driver" or "emulated"; anything else is InvalidArgument.
absl::StatusOr<PcieMode> ParsePcieMode(std::string_view text);
std::string_view PcieModeName(PcieMode mode);

inline constexpr size_t kEmulatedChunkSize = size_t{2} << 20;

struct TransferOptions {
  // Emulated mode: bytes of plaintext per AES-GCM chunk (4 KiB to 64 MiB).
  size_t chunk_size = kEmulatedChunkSize;
  // Threads that encrypt and decrypt chunks, the calling thread included; 0: the hardware
  // threads, at most 8.
  int threads = 0;
  // The largest transfer accepted (also the largest staging buffer).
  size_t max_transfer_size = size_t{1} << 30;
  // Idle blocks each pool keeps for reuse.
  size_t max_idle_buffers = 8;
  // Lock staging memory (mlock). A GPU build could also register it with the driver.
  bool pin = true;
  // Emulated mode only: called with the bounce buffer (ciphertext and tags) between encryption
  // and decryption, so tests can play the untrusted host that modifies memory in flight.
  std::function<void(std::span<uint8_t>)> in_flight_hook_for_test;
};

class TransferPath {
 public:
  // InvalidArgument for a chunk size outside 4 KiB..64 MiB or a negative thread count.
  static absl::StatusOr<std::unique_ptr<TransferPath>> Create(PcieMode mode,
                                                              TransferOptions options = {});
  ~TransferPath();
  TransferPath(const TransferPath&) = delete;
  TransferPath& operator=(const TransferPath&) = delete;

  PcieMode mode() const { return mode_; }
  int threads() const;

  // A zeroed staging buffer on the host (enclave CPU) side / on the executor's side, to gather a
  // batch into before ToDevice / ToHost. InvalidArgument over max_transfer_size.
  absl::StatusOr<StagingBuffer> AcquireHostStaging(size_t size);
  absl::StatusOr<StagingBuffer> AcquireDeviceStaging(size_t size);

  // Moves `host` in one transfer and returns the executor-side buffer holding the same bytes
  // (exactly host.size() of them). Emulated: DataLoss when a chunk fails authentication, and
  // nothing is returned. InvalidArgument over max_transfer_size.
  absl::StatusOr<StagingBuffer> ToDevice(ByteSpan host);
  // ToDevice of a buffer of `size` bytes that is never built: `pieces` (sorted by offset, not
  // overlapping, inside `size`) say where each run of bytes lies, and the bytes between them are
  // zeros. Emulated mode seals straight from the pieces, so a batch gathered from many requests
  // costs no copy into a host staging buffer first. Internal for pieces out of order, overlapping
  // or past `size`; otherwise the errors of ToDevice.
  absl::StatusOr<StagingBuffer> GatherToDevice(size_t size, std::span<const GatherPiece> pieces);
  // The way back: executor-side bytes to a host staging buffer. Same errors.
  absl::StatusOr<StagingBuffer> ToHost(ByteSpan device);

  struct Stats {
    uint64_t to_device_transfers = 0;
    uint64_t to_host_transfers = 0;
    uint64_t to_device_size = 0;  // bytes
    uint64_t to_host_size = 0;
    uint64_t chunks_sealed = 0;  // emulated mode
    uint64_t authentication_failures = 0;
    StagingPool::Stats host_pool, device_pool, bounce_pool;
  };
  Stats stats() const;

 private:
  enum class Direction : uint8_t { kToDevice = kToDeviceDirection, kToHost = kToHostDirection };

  TransferPath(PcieMode mode, TransferOptions options);
  // The one transfer both ways: the gathered buffer of `size` bytes described by `pieces` lands
  // in a buffer from `destination`.
  absl::StatusOr<StagingBuffer> Move(Direction direction, size_t size,
                                     std::span<const GatherPiece> pieces, StagingPool& destination);

  const PcieMode mode_;
  const TransferOptions options_;
  StagingPool host_pool_;
  StagingPool device_pool_;
  StagingPool bounce_pool_;
  std::unique_ptr<ChunkCipher> cipher_;  // emulated mode only
  struct Counters;
  std::unique_ptr<Counters> counters_;
};

}  // namespace cloister::enclave::pcie
