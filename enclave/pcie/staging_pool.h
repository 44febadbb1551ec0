// Staging memory for the PCIe path: a pool of page-aligned blocks that hold a whole batch's
// tensors (or its ciphertext) on their way to or from the executor. Blocks are locked in memory
// (mlock, best effort: RLIMIT_MEMLOCK may refuse, which stats() reports), kept out of core
// dumps, reused across batches, and zeroed when a lease ends: a block sitting in the pool is
// always all zeros, so no batch ever receives another batch's (or tenant's) bytes, and a block
// is freed only after it was zeroed. The one exception is a pool made with `wipe` off, for
// ciphertext only (the emulated path's bounce buffers, which the host may read anyway and whose
// every byte the next transfer overwrites): its leases keep what the last one left.
//
// Threading: StagingPool is thread-safe. A StagingBuffer (one lease) belongs to one owner at a
// time, like a std::vector.
// Ownership: a lease keeps the pool's shared state alive, so leases may outlive the StagingPool
// object; the last of them frees the blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::enclave::pcie {

namespace internal {
struct PoolState;
struct Block;
}  // namespace internal

// One lease on a pooled block: `size()` usable bytes (the block may be larger).
class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer() { Release(); }
  StagingBuffer(StagingBuffer&& other) noexcept;
  StagingBuffer& operator=(StagingBuffer&& other) noexcept;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  uint8_t* data() const;
  size_t size() const { return size_; }
  std::span<uint8_t> span() const { return {data(), size_}; }
  ByteSpan view() const { return {data(), size_}; }
  // Bytes in the underlying block (at least size()).
  size_t capacity() const;
  // True when the block is locked in memory.
  bool pinned() const;
  bool valid() const { return block_ != nullptr; }

  // Zeroes the leased bytes (unless the pool's `wipe` is off) and returns the block to its pool
  // (the destructor does the same).
  void Release();

 private:
  friend class StagingPool;
  std::shared_ptr<internal::PoolState> pool_;
  internal::Block* block_ = nullptr;
  size_t size_ = 0;
};

struct StagingPoolOptions {
  bool pin = true;                          // mlock each block (best effort)
  size_t max_idle_blocks = 8;               // blocks kept for reuse; more are freed
  size_t max_block_size = size_t{1} << 30;  // larger requests are refused
  // Zero a lease's bytes when it ends. Off only for a pool that never holds plaintext: its
  // Acquire then hands out a reused block with the bytes the last lease wrote.
  bool wipe = true;
};

class StagingPool {
 public:
  explicit StagingPool(StagingPoolOptions options = {});
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A zeroed buffer of `size` bytes (a reused block when one is big enough; with `wipe` off, a
  // reused block is not zeroed). InvalidArgument
  // over max_block_size, ResourceExhausted when the memory cannot be mapped.
  absl::StatusOr<StagingBuffer> Acquire(size_t size);

  struct Stats {
    uint64_t acquired = 0;      // leases handed out
    uint64_t reused = 0;        // of which served from an idle block
    uint64_t allocated = 0;     // blocks mapped
    uint64_t freed = 0;         // blocks unmapped
    uint64_t pin_failures = 0;  // blocks that could not be locked
    size_t idle_blocks = 0;
  };
  Stats stats() const;

 private:
  std::shared_ptr<internal::PoolState> state_;
};

}  // namespace cloister::enclave::pcie
