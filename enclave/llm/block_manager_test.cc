#include "enclave/llm/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr int32_t kBlockSize = 4;

std::vector<uint8_t> Salt(uint8_t fill) { return std::vector<uint8_t>(32, fill); }

std::vector<int32_t> Tokens(int32_t count, int32_t first = 100) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

class BlockManagerTest : public ::testing::Test {
 protected:
  BlockManager Make(int32_t num_blocks) {
    return BlockManager(num_blocks, kBlockSize,
                        [this](int32_t block) { scrubbed_.push_back(block); });
  }

  // Allocates blocks for `tokens`, registers the full ones, and returns the block table.
  std::vector<int32_t> Prefill(BlockManager& manager, const std::string& tenant,
                               const std::vector<uint8_t>& salt,
                               const std::vector<int32_t>& tokens) {
    const int32_t count = (static_cast<int32_t>(tokens.size()) + kBlockSize - 1) / kBlockSize;
    absl::StatusOr<std::vector<int32_t>> blocks = manager.Allocate(tenant, count);
    EXPECT_TRUE(blocks.ok()) << blocks.status();
    for (int32_t i = 0; i < count; ++i) {
      manager.RegisterFullBlock(tenant, salt, tokens, i, (*blocks)[i]);
    }
    return *blocks;
  }

  std::vector<int32_t> scrubbed_;
};

TEST_F(BlockManagerTest, AllocatesDistinctBlocksAndCountsThem) {
  BlockManager manager = Make(8);
  EXPECT_EQ(manager.free_blocks(), 8);
  absl::StatusOr<std::vector<int32_t>> first = manager.Allocate("a", 3);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(*first, ElementsAre(0, 1, 2));
  absl::StatusOr<std::vector<int32_t>> second = manager.Allocate("b", 2);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(*second, ElementsAre(3, 4));
  EXPECT_EQ(manager.free_blocks(), 3);
  EXPECT_EQ(manager.used_blocks("a"), 3);
  EXPECT_EQ(manager.used_blocks("b"), 2);
  EXPECT_EQ(manager.used_blocks("nobody"), 0);
  absl::StatusOr<std::vector<int32_t>> none = manager.Allocate("a", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
  EXPECT_TRUE(scrubbed_.empty());
}

TEST_F(BlockManagerTest, ExhaustionLeavesStateUnchanged) {
  BlockManager manager = Make(4);
  ASSERT_TRUE(manager.Allocate("a", 3).ok());
  const absl::StatusOr<std::vector<int32_t>> refused = manager.Allocate("b", 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("KV cache full: 2 blocks needed, 1 free of 4"));
  EXPECT_EQ(manager.free_blocks(), 1);
  EXPECT_EQ(manager.used_blocks("b"), 0);
  EXPECT_EQ(manager.used_blocks("a"), 3);
  absl::StatusOr<std::vector<int32_t>> last = manager.Allocate("b", 1);
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(*last, ElementsAre(3));
}

TEST_F(BlockManagerTest, QuotaLimitsOneTenantOnly) {
  BlockManager manager = Make(10);
  manager.SetTenantQuota("a", 2);
  const absl::StatusOr<std::vector<int32_t>> too_many = manager.Allocate("a", 3);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_many.status().message()),
              HasSubstr("quota exceeded: the tenant holds 0 blocks of its 2 and asks for 3 more"));
  EXPECT_EQ(manager.free_blocks(), 10);
  absl::StatusOr<std::vector<int32_t>> two = manager.Allocate("a", 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(manager.Allocate("a", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(manager.used_blocks("a"), 2);
  EXPECT_TRUE(manager.Allocate("b", 5).ok());  // no quota for b
  manager.Release("a", *two);
  EXPECT_TRUE(manager.Allocate("a", 2).ok());  // released blocks no longer count
}

TEST_F(BlockManagerTest, NegativeCountIsRefused) {
  BlockManager manager = Make(2);
  const absl::StatusOr<std::vector<int32_t>> refused = manager.Allocate("a", -1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("got -1"));
}

TEST_F(BlockManagerTest, ReleaseScrubsAndFreesUncachedBlocks) {
  BlockManager manager = Make(4);
  absl::StatusOr<std::vector<int32_t>> blocks = manager.Allocate("a", 3);
  ASSERT_TRUE(blocks.ok());
  manager.Release("a", std::vector<int32_t>{(*blocks)[1]});
  EXPECT_THAT(scrubbed_, ElementsAre(1));
  EXPECT_EQ(manager.free_blocks(), 2);
  EXPECT_EQ(manager.used_blocks("a"), 2);
  manager.Release("a", std::vector<int32_t>{(*blocks)[0], (*blocks)[2]});
  EXPECT_THAT(scrubbed_, ElementsAre(1, 0, 2));
  EXPECT_EQ(manager.free_blocks(), 4);
  EXPECT_EQ(manager.used_blocks("a"), 0);
  EXPECT_EQ(manager.evictable_blocks(), 0);
}

TEST_F(BlockManagerTest, PrefixMatchesAcrossRequestsOfOneTenant) {
  BlockManager manager = Make(8);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(10);  // two full blocks and a partial one
  const std::vector<int32_t> table = Prefill(manager, "a", salt, prompt);
  ASSERT_EQ(table.size(), 3u);
  manager.Release("a", table);
  // The partial third block was not cached: scrubbed and freed. The full ones stay cached.
  EXPECT_THAT(scrubbed_, ElementsAre(table[2]));
  EXPECT_EQ(manager.evictable_blocks(), 2);
  EXPECT_EQ(manager.free_blocks(), 8);
  EXPECT_EQ(manager.used_blocks("a"), 0);

  // The same prompt continued: both full blocks match, in order.
  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  longer.push_back(8);
  EXPECT_THAT(manager.MatchPrefix("a", salt, longer), ElementsAre(table[0], table[1]));
  EXPECT_EQ(manager.used_blocks("a"), 2);
  EXPECT_EQ(manager.evictable_blocks(), 0);
  EXPECT_EQ(manager.free_blocks(), 6);
  manager.Release("a", std::vector<int32_t>{table[0], table[1]});

  // Only the first block in common.
  std::vector<int32_t> diverging = prompt;
  diverging[5] = 9999;
  EXPECT_THAT(manager.MatchPrefix("a", salt, diverging), ElementsAre(table[0]));
  manager.Release("a", std::vector<int32_t>{table[0]});

  // The second block alone does not match without the first (the key chains them).
  std::vector<int32_t> second_only(prompt.begin() + kBlockSize, prompt.end());
  EXPECT_THAT(manager.MatchPrefix("a", salt, second_only), IsEmpty());
  // Shorter than a block: nothing.
  EXPECT_THAT(manager.MatchPrefix("a", salt, Tokens(kBlockSize - 1)), IsEmpty());
}

TEST_F(BlockManagerTest, PartialLastBlockIsNeverCached) {
  BlockManager manager = Make(4);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(kBlockSize + 2);
  const std::vector<int32_t> table = Prefill(manager, "a", salt, prompt);
  // Same six tokens then more, so block 1 would be full now: it was registered partial, so
  // it must not match.
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  longer.push_back(2);
  EXPECT_THAT(manager.MatchPrefix("a", salt, longer), ElementsAre(table[0]));
  manager.Release("a", std::vector<int32_t>{table[0]});
  manager.Release("a", table);
  EXPECT_THAT(scrubbed_, ElementsAre(table[1]));
}

TEST_F(BlockManagerTest, NoMatchAcrossTenantsOrSalts) {
  BlockManager manager = Make(8);
  const std::vector<int32_t> prompt = Tokens(8);
  const std::vector<int32_t> table = Prefill(manager, "a", Salt(1), prompt);
  // Identical tokens, another tenant with its own salt.
  EXPECT_THAT(manager.MatchPrefix("b", Salt(2), prompt), IsEmpty());
  // Even with tenant a's salt, b's table is its own.
  EXPECT_THAT(manager.MatchPrefix("b", Salt(1), prompt), IsEmpty());
  // Tenant a with another salt (say, after a key rotation).
  EXPECT_THAT(manager.MatchPrefix("a", Salt(3), prompt), IsEmpty());
  EXPECT_EQ(manager.used_blocks("b"), 0);
  // And tenant b registering the same tokens gets its own blocks, not a's.
  const std::vector<int32_t> other = Prefill(manager, "b", Salt(2), prompt);
  EXPECT_THAT(manager.MatchPrefix("b", Salt(2), prompt), ElementsAre(other[0], other[1]));
  EXPECT_THAT(manager.MatchPrefix("a", Salt(1), prompt), ElementsAre(table[0], table[1]));
}

TEST_F(BlockManagerTest, SharedPrefixRefcounts) {
  BlockManager manager = Make(8);
  const std::vector<uint8_t> salt = Salt(5);
  const std::vector<int32_t> prompt = Tokens(8);
  const std::vector<int32_t> first = Prefill(manager, "a", salt, prompt);
  // A second sequence shares both blocks while the first still runs.
  const std::vector<int32_t> second = manager.MatchPrefix("a", salt, prompt);
  EXPECT_EQ(second, first);
  EXPECT_EQ(manager.used_blocks("a"), 2);  // distinct blocks
  EXPECT_EQ(manager.free_blocks(), 6);
  manager.Release("a", first);
  EXPECT_EQ(manager.evictable_blocks(), 0);  // still referenced by the second
  EXPECT_EQ(manager.used_blocks("a"), 2);
  EXPECT_EQ(manager.free_blocks(), 6);
  manager.Release("a", second);
  EXPECT_EQ(manager.evictable_blocks(), 2);
  EXPECT_EQ(manager.used_blocks("a"), 0);
  EXPECT_EQ(manager.free_blocks(), 8);
  EXPECT_TRUE(scrubbed_.empty());  // cached blocks are not scrubbed until evicted
}

TEST_F(BlockManagerTest, EvictionIsLeastRecentlyReleasedFirstAndScrubs) {
  BlockManager manager = Make(4);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> p1 = Tokens(kBlockSize, 10);
  const std::vector<int32_t> p2 = Tokens(kBlockSize, 20);
  const std::vector<int32_t> p3 = Tokens(kBlockSize, 30);
  const std::vector<int32_t> b1 = Prefill(manager, "a", salt, p1);
  const std::vector<int32_t> b2 = Prefill(manager, "a", salt, p2);
  const std::vector<int32_t> b3 = Prefill(manager, "a", salt, p3);
  manager.Release("a", b1);
  manager.Release("a", b2);
  manager.Release("a", b3);
  // Touch p1 again: now p2 is the least recently released.
  manager.Release("a", manager.MatchPrefix("a", salt, p1));
  EXPECT_EQ(manager.free_blocks(), 4);
  // One truly free block, then evictions.
  absl::StatusOr<std::vector<int32_t>> fresh = manager.Allocate("b", 1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(scrubbed_.empty());  // came from the free pool
  fresh = manager.Allocate("b", 1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_THAT(*fresh, ElementsAre(b2[0]));
  EXPECT_THAT(scrubbed_, ElementsAre(b2[0]));  // scrubbed before it was handed out
  EXPECT_THAT(manager.MatchPrefix("a", salt, p2), IsEmpty());
  fresh = manager.Allocate("b", 1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_THAT(*fresh, ElementsAre(b3[0]));
  EXPECT_THAT(scrubbed_, ElementsAre(b2[0], b3[0]));
  EXPECT_THAT(manager.MatchPrefix("a", salt, p1), ElementsAre(b1[0]));
  EXPECT_EQ(manager.free_blocks(), 0);
  EXPECT_EQ(manager.Allocate("b", 1).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BlockManagerTest, ASequencesLastBlocksAreEvictedFirst) {
  BlockManager manager = Make(3);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(3 * kBlockSize);
  const std::vector<int32_t> table = Prefill(manager, "a", salt, prompt);
  manager.Release("a", table);
  absl::StatusOr<std::vector<int32_t>> taken = manager.Allocate("b", 1);
  ASSERT_TRUE(taken.ok());
  EXPECT_THAT(*taken, ElementsAre(table[2]));
  // The head of the chain survives, so the prefix still helps.
  EXPECT_THAT(manager.MatchPrefix("a", salt, prompt), ElementsAre(table[0], table[1]));
}

TEST_F(BlockManagerTest, MatchPrefixRespectsTheQuota) {
  BlockManager manager = Make(8);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(3 * kBlockSize);
  const std::vector<int32_t> table = Prefill(manager, "a", salt, prompt);
  manager.Release("a", table);
  manager.SetTenantQuota("a", 2);
  ASSERT_TRUE(manager.Allocate("a", 1).ok());
  // One block of quota left: only the first cached block can be revived.
  EXPECT_THAT(manager.MatchPrefix("a", salt, prompt), ElementsAre(table[0]));
  EXPECT_EQ(manager.used_blocks("a"), 2);
  // Blocks the tenant already references cost no quota.
  EXPECT_THAT(manager.MatchPrefix("a", salt, Tokens(kBlockSize)), ElementsAre(table[0]));
  EXPECT_EQ(manager.used_blocks("a"), 2);
}

TEST_F(BlockManagerTest, FirstRegistrationOfAKeyWins) {
  BlockManager manager = Make(4);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(kBlockSize);
  // Two sequences with the same prompt prefilled at the same time.
  const std::vector<int32_t> first = Prefill(manager, "a", salt, prompt);
  const std::vector<int32_t> second = Prefill(manager, "a", salt, prompt);
  manager.Release("a", second);
  EXPECT_THAT(scrubbed_, ElementsAre(second[0]));  // never cached: freed at once
  manager.Release("a", first);
  EXPECT_EQ(manager.evictable_blocks(), 1);
  EXPECT_THAT(manager.MatchPrefix("a", salt, prompt), ElementsAre(first[0]));
}

TEST_F(BlockManagerTest, RegisterFullBlocksMatchesRegisterFullBlock) {
  BlockManager manager = Make(8);
  const std::vector<uint8_t> salt = Salt(9);
  const std::vector<int32_t> prompt = Tokens(3 * kBlockSize + 1);
  absl::StatusOr<std::vector<int32_t>> table = manager.Allocate("a", 4);
  ASSERT_TRUE(table.ok());
  manager.RegisterFullBlocks("a", salt, prompt, *table);
  manager.Release("a", *table);
  EXPECT_THAT(scrubbed_, ElementsAre((*table)[3]));  // the partial block
  EXPECT_THAT(manager.MatchPrefix("a", salt, prompt),
              ElementsAre((*table)[0], (*table)[1], (*table)[2]));
}

TEST_F(BlockManagerTest, KeysDependOnEveryToken) {
  BlockManager manager = Make(16);
  const std::vector<uint8_t> salt = Salt(1);
  const std::vector<int32_t> prompt = Tokens(2 * kBlockSize);
  const std::vector<int32_t> table = Prefill(manager, "a", salt, prompt);
  for (size_t i = 0; i < prompt.size(); ++i) {
    std::vector<int32_t> changed = prompt;
    changed[i] ^= 1 << 20;  // a high byte: the encoding must cover all four bytes
    const std::vector<int32_t> matched = manager.MatchPrefix("a", salt, changed);
    EXPECT_EQ(matched.size(), i / kBlockSize) << "token " << i;
    manager.Release("a", matched);
  }
}

TEST(BlockManagerDeathTest, ReleasingABlockTheTenantDoesNotHoldCrashes) {
  BlockManager manager(2, kBlockSize, [](int32_t) {});
  absl::StatusOr<std::vector<int32_t>> blocks = manager.Allocate("a", 1);
  ASSERT_TRUE(blocks.ok());
  ASSERT_TRUE(manager.Allocate("b", 0).ok());
  EXPECT_DEATH(manager.Release("b", *blocks), "owner");
  manager.Release("a", *blocks);
  EXPECT_DEATH(manager.Release("a", *blocks), "refcount");
}

}  // namespace
}  // namespace cloister::llm
