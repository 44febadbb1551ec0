// The chunked AES-256-GCM format of the emulated PCIe path (DESIGN.md section 7), and a pool of
// CPU threads that seals and opens it. A transfer of `size` plaintext bytes is cut into chunks
// of `chunk_size` bytes (the last may be shorter; an empty transfer is one empty chunk). The
// sealed ("bounce") buffer holds, for each chunk i in order, its ciphertext followed by its
// 16-byte tag, so chunk i starts at i * (chunk_size + 16). Chunk i's nonce is
// direction (1 byte) || transfer counter (7 bytes) || i (4 bytes), big-endian; every chunk's
// associated data is kTransferAadLabel || size (8 bytes) || chunk count (4 bytes), big-endian.
// So a chunk modified, moved to another place, transfer or direction, or dropped from the end,
// fails authentication. The CPU side (this file) and the CUDA side (enclave/gpu/cuda_gcm.h)
// implement the same format and are tested against each other.
//
// Threading: a ChunkCipher is thread-safe; Seal and Open may run on many threads at once (their
// chunks share the pool). Ownership: plain values; the key is copied into the AES contexts.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::enclave::pcie {

inline constexpr std::string_view kTransferAadLabel = "cloister/v1 pcie transfer";
// The directions of a transfer: the first byte of every chunk nonce.
inline constexpr uint8_t kToDeviceDirection = 1;
inline constexpr uint8_t kToHostDirection = 2;
// The chunk sizes a path accepts.
inline constexpr size_t kMinChunkSize = size_t{4} << 10;
inline constexpr size_t kMaxChunkSize = size_t{64} << 20;
inline constexpr size_t kChunkTagSize = 16;
inline constexpr size_t kChunkNonceSize = 12;
inline constexpr size_t kTransferAadSize = kTransferAadLabel.size() + 8 + 4;
// SealThenOpen's pipeline step: an opener follows its chunk's sealer this many bytes at a time
// (the opener's last step is the transfer's tail: 1.77 MB took 520 us at 256 KiB, 450 at 64).
inline constexpr size_t kPipelinePiece = size_t{64} << 10;
// Transfers smaller than this are not pipelined: waking a second thread for each piece cost
// more than it saved (256 KiB: 119 us on one thread, 130-150 pipelined).
inline constexpr size_t kPipelineMinimum = size_t{512} << 10;

// `size` bytes from `source` (host memory, or the executor's memory where a path says so) to
// `offset` of a buffer or a transfer.
struct GatherPiece {
  size_t offset = 0;
  const void* source = nullptr;
  size_t size = 0;
};

// Internal unless the pieces lie in order of offset, apart, inside a transfer of `size` bytes
// (a caller's layout that is wrong).
absl::Status CheckGatherPieces(size_t size, std::span<const GatherPiece> pieces);

// `source` as the pieces of a transfer of source.size() bytes: `piece` covering all of it, or
// none when it is empty. The span refers to `piece`.
inline std::span<const GatherPiece> WholePiece(ByteSpan source, GatherPiece& piece) {
  piece = GatherPiece{0, source.data(), source.size()};
  return {&piece, source.empty() ? size_t{0} : size_t{1}};
}

// Chunks of a transfer of `size` bytes: at least one.
size_t ChunkCount(size_t size, size_t chunk_size);
// Bytes of the sealed form of `size` plaintext bytes.
size_t SealedSize(size_t size, size_t chunk_size);
std::array<uint8_t, kChunkNonceSize> ChunkNonce(uint8_t direction, uint64_t counter,
                                                uint32_t chunk);
std::array<uint8_t, kTransferAadSize> TransferAad(size_t size, size_t chunks);

// The transfer counters of one key, one per direction: every transfer takes the next, so no
// two transfers in a direction share a nonce. Thread-safe.
class TransferCounters {
 public:
  // The next counter of `direction` (kToDeviceDirection or kToHostDirection); ResourceExhausted
  // once its 56 bits are used up (the key must then be replaced: restart the enclave).
  absl::StatusOr<uint64_t> Next(uint8_t direction);

 private:
  std::atomic<uint64_t> next_[3] = {0, 0, 0};  // indexed by direction
};

class ChunkCipher {
 public:
  // `threads` counts the calling thread (at least 1). InvalidArgument for a key that is not 32
  // bytes or a chunk size of 0.
  static absl::StatusOr<std::unique_ptr<ChunkCipher>> Create(ByteSpan key, size_t chunk_size,
                                                             int threads);
  ~ChunkCipher();
  ChunkCipher(const ChunkCipher&) = delete;
  ChunkCipher& operator=(const ChunkCipher&) = delete;

  size_t chunk_size() const { return chunk_size_; }
  int threads() const;

  // Seals `source` into `sealed` (exactly SealedSize(source.size()) bytes).
  absl::Status Seal(uint8_t direction, uint64_t counter, ByteSpan source,
                    std::span<uint8_t> sealed) const;
  // The same for a transfer of `size` bytes given as pieces in host memory, sealed straight from
  // where they lie (no gather copy): CheckGatherPieces' errors, and the bytes between the pieces
  // are zeros. The bytes sealed are those of the gathered buffer.
  absl::Status Seal(uint8_t direction, uint64_t counter, size_t size,
                    std::span<const GatherPiece> pieces, std::span<uint8_t> sealed) const;
  // Opens `sealed` into `destination` (its plaintext size). DataLoss naming the first chunk that
  // fails authentication and `what` (e.g. "to the device"); `destination` is then undefined and
  // must be discarded by the caller.
  absl::Status Open(uint8_t direction, uint64_t counter, ByteSpan sealed,
                    std::span<uint8_t> destination, std::string_view what) const;
  // Seal into `sealed`, then Open into `destination`, chunk by chunk, with no thread waiting for
  // the whole transfer between the two halves (a pipelined bus). With fewer than 4 chunks per
  // thread (and at least kPipelineMinimum bytes), each chunk's opener runs on another thread
  // kPipelinePiece bytes behind its sealer, so a one-chunk transfer costs about one pass over
  // its bytes in time, not two, and a few chunks spread evenly over the threads (whole chunks
  // on one thread each left one thread with more work than another: 7 MB in 4 chunks on 2
  // threads took 2.0 ms, pipelined 1.8 ms). With more chunks, or one thread, each chunk is
  // sealed and then opened by one thread (64 MiB on 2 threads: 17-18 ms, pipelined 18-22 ms).
  // The bytes sealed are the same either way. Errors as for Open.
  absl::Status SealThenOpen(uint8_t direction, uint64_t counter, ByteSpan source,
                            std::span<uint8_t> sealed, std::span<uint8_t> destination,
                            std::string_view what) const;
  // The same with the plaintext given as pieces, as for Seal; `destination` is `size` bytes.
  absl::Status SealThenOpen(uint8_t direction, uint64_t counter, size_t size,
                            std::span<const GatherPiece> pieces, std::span<uint8_t> sealed,
                            std::span<uint8_t> destination, std::string_view what) const;

 private:
  class Workers;
  ChunkCipher(size_t chunk_size, std::unique_ptr<Workers> workers);

  const size_t chunk_size_;
  std::unique_ptr<Workers> workers_;
};

}  // namespace cloister::enclave::pcie
