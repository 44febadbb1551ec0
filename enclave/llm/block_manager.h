// BlockManager: the bookkeeping of the paged KV cache (which block belongs to whom, reference
// counts, per-tenant quotas and the per-tenant prefix cache). The memory itself lives elsewhere
// (KvCache); the manager asks for a block to be scrubbed, through the callback, every time the
// block goes back to the free pool, before anyone can get it again.
//
// Prefix cache: a full block (block_size tokens) can be registered under a key that chains the
// keys of all blocks before it: key_0 = BLAKE2b-256 keyed by the tenant's salt over the first
// block's token ids (little-endian int32), key_i = the same over key_{i-1} followed by block
// i's ids. The salt is a per-tenant secret the enclave derives (never taken from a request),
// and the table itself is kept per tenant, so identical prompts of two tenants neither share
// nor probe each other's entries. Partial blocks are never cached.
//
// Block states: free (in the pool, scrubbed, no owner); referenced (refcount > 0, owned by one
// tenant, counted to its quota); evictable (cached, refcount 0: not counted to any quota, kept
// for a later match, reclaimed least recently released first when Allocate needs room, and
// scrubbed then). free_blocks() counts free and evictable blocks: what Allocate can hand out.
//
// Broken invariants crash (CLOISTER_CHECK): releasing a block that the tenant does not hold,
// registering a block the tenant does not hold, or a salt outside [16, 64] bytes.
//
// Threading: not thread-safe; the generator's thread owns it. The scrub callback runs on the
// calling thread, inside Release and Allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::llm {

class BlockManager {
 public:
  // Salt sizes BLAKE2b accepts as a key (libsodium's crypto_generichash_KEYBYTES_MIN/MAX).
  static constexpr size_t kMinSaltSize = 16;
  static constexpr size_t kMaxSaltSize = 64;

  // num_blocks > 0 and block_size > 0 (checked). scrub(block) is called for each block that
  // goes back to the free pool (before any reuse).
  BlockManager(int32_t num_blocks, int32_t block_size, std::function<void(int32_t)> scrub);

  // Limits the blocks the tenant may hold referenced at once (max_blocks >= 0, checked); the
  // default is no quota beyond the pool. Lowering it below current use only stops new
  // allocations.
  void SetTenantQuota(const std::string& tenant, int32_t max_blocks);

  // Allocates `count` fresh blocks for the tenant (refcount 1), taking free blocks first and
  // then evicting cached ones, least recently released first. ResourceExhausted with a
  // one-line reason when the pool or the tenant's quota cannot give them, and then nothing is
  // allocated or evicted; InvalidArgument for a negative count.
  absl::StatusOr<std::vector<int32_t>> Allocate(const std::string& tenant, int32_t count);

  // Drops one reference to each block (a block listed twice loses two). A block at refcount 0
  // is scrubbed and freed, unless it is cached: then it becomes evictable, the blocks of one
  // call in reverse order, so a sequence's last blocks are evicted before its first ones (a
  // chain is useless without its head).
  void Release(const std::string& tenant, std::span<const int32_t> blocks);

  // Blocks Allocate can hand out now: free plus evictable.
  int32_t free_blocks() const;
  // Cached blocks at refcount 0 (a part of free_blocks()).
  int32_t evictable_blocks() const { return static_cast<int32_t>(evictable_.size()); }
  // Distinct blocks the tenant references (what its quota counts).
  int32_t used_blocks(const std::string& tenant) const;
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }

  // Returns the cached blocks of the longest run of full leading blocks of `tokens` already
  // registered by this tenant under this salt, each with one more reference counted to the
  // tenant. It stops early where taking an evictable block would exceed the tenant's quota.
  // A caller that needs the logits of the last prompt token matches all but that token.
  std::vector<int32_t> MatchPrefix(const std::string& tenant, std::span<const uint8_t> salt,
                                   std::span<const int32_t> tokens);

  // Marks `block` (referenced by the tenant, holding the block_index-th full block of `tokens`)
  // as cached under its chain key so later MatchPrefix calls find it. Does nothing when
  // `tokens` does not fill that block, when the key is already cached (another sequence got
  // there first; this block stays uncached and is freed normally), or when the block is
  // already cached.
  void RegisterFullBlock(const std::string& tenant, std::span<const uint8_t> salt,
                         std::span<const int32_t> tokens, int32_t block_index, int32_t block);

  // RegisterFullBlock for every full block of `tokens`, block i being block_table[i]; one hash
  // per block instead of a chain recomputed for each.
  void RegisterFullBlocks(const std::string& tenant, std::span<const uint8_t> salt,
                          std::span<const int32_t> tokens, std::span<const int32_t> block_table);

 private:
  static constexpr int32_t kNoLimit = -1;
  struct Tenant {
    int32_t used = 0;
    int32_t quota = kNoLimit;
    std::unordered_map<std::string, int32_t> cache;  // chain key -> block
  };
  struct Block {
    int32_t refcount = 0;
    Tenant* owner = nullptr;                          // null while free; tenants_ nodes never move
    std::string cache_key;                            // empty when not cached
    std::list<int32_t>::iterator evictable_position;  // valid while evictable
  };

  Tenant& TenantFor(const std::string& tenant) { return tenants_[tenant]; }
  // The chain key of the block holding `block_tokens` after the block whose key is `previous`
  // (empty for the first block).
  static std::string ChainKey(std::span<const uint8_t> salt, const std::string& previous,
                              std::span<const int32_t> block_tokens);
  // Caches `block` under `key` for `owner` when neither is cached yet.
  void Register(Tenant& owner, std::string key, int32_t block);
  // Takes a block off the evictable list and out of its tenant's cache and scrubs it; the
  // block is then unowned and not in the free pool.
  void Evict(int32_t block);

  int32_t block_size_;
  std::function<void(int32_t)> scrub_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;     // a stack; at the start the lowest ids come first
  std::list<int32_t> evictable_;  // least recently released first
  std::unordered_map<std::string, Tenant> tenants_;
};

}  // namespace cloister::llm
