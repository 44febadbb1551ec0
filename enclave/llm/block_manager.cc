#include "enclave/llm/block_manager.h"

#include <sodium.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::llm {
namespace {

constexpr size_t kChainKeySize = 32;  // BLAKE2b-256

}  // namespace

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size,
                           std::function<void(int32_t)> scrub)
    : block_size_(block_size), scrub_(std::move(scrub)) {
  CLOISTER_CHECK(num_blocks > 0);
  CLOISTER_CHECK(block_size > 0);
  CLOISTER_CHECK(scrub_ != nullptr);
  static const bool sodium_ready = sodium_init() >= 0;
  CLOISTER_CHECK(sodium_ready);
  blocks_.resize(num_blocks);
  free_.reserve(num_blocks);
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

void BlockManager::SetTenantQuota(const std::string& tenant, int32_t max_blocks) {
  CLOISTER_CHECK(max_blocks >= 0);
  TenantFor(tenant).quota = max_blocks;
}

absl::StatusOr<std::vector<int32_t>> BlockManager::Allocate(const std::string& tenant,
                                                            int32_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV block count must be >= 0, got ", count));
  }
  Tenant& owner = TenantFor(tenant);
  if (owner.quota != kNoLimit && int64_t{owner.used} + count > owner.quota) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache quota exceeded: the tenant holds ",
                                                     owner.used, " blocks of its ", owner.quota,
                                                     " and asks for ", count, " more"));
  }
  if (count > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", count, " blocks needed, ",
                                                     free_blocks(), " free of ", num_blocks()));
  }
  std::vector<int32_t> allocated;
  allocated.reserve(count);
  for (int32_t i = 0; i < count; ++i) {
    int32_t block;
    if (!free_.empty()) {
      block = free_.back();
      free_.pop_back();
    } else {
      block = evictable_.front();
      Evict(block);
    }
    Block& state = blocks_[block];
    state.refcount = 1;
    state.owner = &owner;
    ++owner.used;
    allocated.push_back(block);
  }
  return allocated;
}

void BlockManager::Evict(int32_t block) {
  Block& state = blocks_[block];
  CLOISTER_CHECK(state.refcount == 0 && !state.cache_key.empty());
  evictable_.erase(state.evictable_position);
  state.owner->cache.erase(state.cache_key);
  state.cache_key.clear();
  state.owner = nullptr;
  scrub_(block);
}

void BlockManager::Release(const std::string& tenant, std::span<const int32_t> blocks) {
  auto found = tenants_.find(tenant);
  CLOISTER_CHECK(found != tenants_.end());
  Tenant& owner = found->second;
  std::vector<int32_t> now_evictable;
  for (int32_t block : blocks) {
    CLOISTER_CHECK(block >= 0 && block < num_blocks());
    Block& state = blocks_[block];
    CLOISTER_CHECK(state.owner == &owner && state.refcount > 0);
    if (--state.refcount > 0) continue;
    --owner.used;
    if (!state.cache_key.empty()) {
      now_evictable.push_back(block);
    } else {
      state.owner = nullptr;
      scrub_(block);
      free_.push_back(block);
    }
  }
  // The last block of the call joins the list first, so it is evicted first.
  for (auto block = now_evictable.rbegin(); block != now_evictable.rend(); ++block) {
    blocks_[*block].evictable_position = evictable_.insert(evictable_.end(), *block);
  }
}

int32_t BlockManager::free_blocks() const {
  return static_cast<int32_t>(free_.size() + evictable_.size());
}

int32_t BlockManager::used_blocks(const std::string& tenant) const {
  auto found = tenants_.find(tenant);
  return found == tenants_.end() ? 0 : found->second.used;
}

std::string BlockManager::ChainKey(std::span<const uint8_t> salt, const std::string& previous,
                                   std::span<const int32_t> block_tokens) {
  CLOISTER_CHECK(salt.size() >= kMinSaltSize && salt.size() <= kMaxSaltSize);
  crypto_generichash_state state;
  CLOISTER_CHECK(crypto_generichash_init(&state, salt.data(), salt.size(), kChainKeySize) == 0);
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(previous.data()),
                            previous.size());
  // Token ids as little-endian int32, the same bytes on every machine.
  std::vector<uint8_t> bytes;
  bytes.reserve(block_tokens.size() * 4);
  for (int32_t id : block_tokens) {
    const auto value = static_cast<uint32_t>(id);
    for (int shift = 0; shift < 32; shift += 8)
      bytes.push_back(static_cast<uint8_t>(value >> shift));
  }
  crypto_generichash_update(&state, bytes.data(), bytes.size());
  std::string key(kChainKeySize, '\0');
  crypto_generichash_final(&state, reinterpret_cast<uint8_t*>(key.data()), key.size());
  sodium_memzero(&state, sizeof(state));  // the state holds the keyed salt
  return key;
}

std::vector<int32_t> BlockManager::MatchPrefix(const std::string& tenant,
                                               std::span<const uint8_t> salt,
                                               std::span<const int32_t> tokens) {
  std::vector<int32_t> matched;
  Tenant& owner = TenantFor(tenant);
  const size_t full_blocks = tokens.size() / block_size_;
  std::string key;
  for (size_t i = 0; i < full_blocks; ++i) {
    key = ChainKey(salt, key, tokens.subspan(i * block_size_, block_size_));
    auto found = owner.cache.find(key);
    if (found == owner.cache.end()) break;
    const int32_t block = found->second;
    Block& state = blocks_[block];
    if (state.refcount == 0) {
      if (owner.quota != kNoLimit && owner.used >= owner.quota) break;
      evictable_.erase(state.evictable_position);
      ++owner.used;
    }
    ++state.refcount;
    matched.push_back(block);
  }
  return matched;
}

void BlockManager::Register(Tenant& owner, std::string key, int32_t block) {
  Block& state = blocks_[block];
  if (!state.cache_key.empty() || owner.cache.contains(key)) return;
  owner.cache.emplace(key, block);
  state.cache_key = std::move(key);
}

void BlockManager::RegisterFullBlock(const std::string& tenant, std::span<const uint8_t> salt,
                                     std::span<const int32_t> tokens, int32_t block_index,
                                     int32_t block) {
  CLOISTER_CHECK(block >= 0 && block < num_blocks() && block_index >= 0);
  Tenant& owner = TenantFor(tenant);
  CLOISTER_CHECK(blocks_[block].owner == &owner && blocks_[block].refcount > 0);
  if ((static_cast<size_t>(block_index) + 1) * block_size_ > tokens.size()) return;
  std::string key;
  for (int32_t i = 0; i <= block_index; ++i) {
    key = ChainKey(salt, key, tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
  }
  Register(owner, std::move(key), block);
}

void BlockManager::RegisterFullBlocks(const std::string& tenant, std::span<const uint8_t> salt,
                                      std::span<const int32_t> tokens,
                                      std::span<const int32_t> block_table) {
  Tenant& owner = TenantFor(tenant);
  const size_t full_blocks = std::min(tokens.size() / block_size_, block_table.size());
  std::string key;
  for (size_t i = 0; i < full_blocks; ++i) {
    const int32_t block = block_table[i];
    CLOISTER_CHECK(block >= 0 && block < num_blocks());
    CLOISTER_CHECK(blocks_[block].owner == &owner && blocks_[block].refcount > 0);
    key = ChainKey(salt, key, tokens.subspan(i * block_size_, block_size_));
    Register(owner, key, block);
  }
}

}  // namespace cloister::llm
