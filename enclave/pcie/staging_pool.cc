#include "enclave/pcie/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/secret_bytes.h"
#include "base/status.h"

namespace cloister::enclave::pcie {

namespace internal {

struct Block {
  uint8_t* data = nullptr;
  size_t capacity = 0;
  bool pinned = false;
};

struct PoolState {
  explicit PoolState(StagingPoolOptions o) : options(o) {}
  ~PoolState() {
    for (Block* block : idle) Unmap(block);
  }

  // Unmaps a block that is already zero (or, in a pool with `wipe` off, holds ciphertext only).
  static void Unmap(Block* block) {
    if (block->pinned) ::munlock(block->data, block->capacity);
    ::munmap(block->data, block->capacity);
    delete block;
  }

  const StagingPoolOptions options;
  mutable absl::Mutex mu;
  std::vector<Block*> idle ABSL_GUARDED_BY(mu);  // all zeros, where options.wipe is on
  StagingPool::Stats stats ABSL_GUARDED_BY(mu);
};

}  // namespace internal

namespace {

constexpr size_t kMinBlockSize = size_t{64} << 10;

// Rounds up to a power of two of at least 64 KiB, so blocks fall into few size classes and
// batches of similar size reuse each other's blocks.
size_t BlockSizeFor(size_t size) {
  size_t capacity = kMinBlockSize;
  while (capacity < size) capacity <<= 1;
  return capacity;
}

}  // namespace

StagingBuffer::StagingBuffer(StagingBuffer&& other) noexcept
    : pool_(std::move(other.pool_)), block_(other.block_), size_(other.size_) {
  other.block_ = nullptr;
  other.size_ = 0;
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::move(other.pool_);
    block_ = other.block_;
    size_ = other.size_;
    other.block_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

uint8_t* StagingBuffer::data() const { return block_ ? block_->data : nullptr; }
size_t StagingBuffer::capacity() const { return block_ ? block_->capacity : 0; }
bool StagingBuffer::pinned() const { return block_ && block_->pinned; }

void StagingBuffer::Release() {
  if (block_ == nullptr) return;
  // Only the leased range can have been written: zero it before anyone else can see it.
  if (pool_->options.wipe) SecureWipe(block_->data, size_);
  internal::Block* block = block_;
  block_ = nullptr;
  size_ = 0;
  std::shared_ptr<internal::PoolState> pool = std::move(pool_);
  internal::Block* to_free = nullptr;
  {
    absl::MutexLock lock(&pool->mu);
    pool->idle.push_back(block);
    if (pool->idle.size() > pool->options.max_idle_blocks) {
      // Drop the smallest idle block: large ones are the expensive ones to map and lock again.
      auto smallest = std::min_element(pool->idle.begin(), pool->idle.end(),
                                       [](const internal::Block* a, const internal::Block* b) {
                                         return a->capacity < b->capacity;
                                       });
      to_free = *smallest;
      pool->idle.erase(smallest);
      ++pool->stats.freed;
    }
  }
  if (to_free != nullptr) internal::PoolState::Unmap(to_free);
}

StagingPool::StagingPool(StagingPoolOptions options)
    : state_(std::make_shared<internal::PoolState>(options)) {}

StagingPool::~StagingPool() = default;

absl::StatusOr<StagingBuffer> StagingPool::Acquire(size_t size) {
  if (size > state_->options.max_block_size) {
    return absl::InvalidArgumentError(absl::StrCat("staging buffer of ", size,
                                                   " bytes exceeds the limit of ",
                                                   state_->options.max_block_size));
  }
  StagingBuffer lease;
  lease.pool_ = state_;
  lease.size_ = size;
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->stats.acquired;
    // The smallest idle block that fits.
    auto best = state_->idle.end();
    for (auto it = state_->idle.begin(); it != state_->idle.end(); ++it) {
      if ((*it)->capacity >= size &&
          (best == state_->idle.end() || (*it)->capacity < (*best)->capacity)) {
        best = it;
      }
    }
    if (best != state_->idle.end()) {
      lease.block_ = *best;
      state_->idle.erase(best);
      ++state_->stats.reused;
      return lease;
    }
  }
  const size_t capacity = BlockSizeFor(size);
  void* mapped =
      ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    lease.pool_.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a staging buffer of ", capacity, " bytes"));
  }
  auto* block = new internal::Block{static_cast<uint8_t*>(mapped), capacity, false};
  // Plaintext tensors never belong in a core dump.
  ::madvise(block->data, capacity, MADV_DONTDUMP);
  if (state_->options.pin) block->pinned = ::mlock(block->data, capacity) == 0;
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->stats.allocated;
    if (state_->options.pin && !block->pinned) ++state_->stats.pin_failures;
  }
  lease.block_ = block;  // fresh anonymous memory is zero
  return lease;
}

StagingPool::Stats StagingPool::stats() const {
  absl::MutexLock lock(&state_->mu);
  Stats stats = state_->stats;
  stats.idle_blocks = state_->idle.size();
  return stats;
}

}  // namespace cloister::enclave::pcie
