#include "host/scheduler/token_bucket.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

TEST(TokenBucketTest, StartsFullAndRefusesWhenEmpty) {
  TokenBucket bucket(/*rate_per_second=*/4, /*burst=*/2, kStart);
  EXPECT_TRUE(bucket.TryTake(kStart));
  EXPECT_TRUE(bucket.TryTake(kStart));
  EXPECT_FALSE(bucket.TryTake(kStart));
  EXPECT_EQ(bucket.tokens(), 0);
}

TEST(TokenBucketTest, RefillsAtTheRateInFractions) {
  TokenBucket bucket(/*rate_per_second=*/4, /*burst=*/1, kStart);
  EXPECT_TRUE(bucket.TryTake(kStart));
  // Half a token after 125 ms: still refused, and the half is kept.
  EXPECT_FALSE(bucket.TryTake(kStart + absl::Milliseconds(125)));
  EXPECT_EQ(bucket.tokens(), 0.5);
  EXPECT_TRUE(bucket.TryTake(kStart + absl::Milliseconds(250)));
  EXPECT_FALSE(bucket.TryTake(kStart + absl::Milliseconds(250)));
}

TEST(TokenBucketTest, RefillStopsAtTheBurst) {
  TokenBucket bucket(/*rate_per_second=*/4, /*burst=*/3, kStart);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bucket.TryTake(kStart));
  const absl::Time later = kStart + absl::Hours(1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bucket.TryTake(later)) << i;
  EXPECT_FALSE(bucket.TryTake(later));
}

TEST(TokenBucketTest, BurstDefaultsToTheRateButAtLeastOne) {
  EXPECT_EQ(TokenBucket(/*rate_per_second=*/5, /*burst=*/0, kStart).burst(), 5);
  EXPECT_EQ(TokenBucket(/*rate_per_second=*/0.5, /*burst=*/0, kStart).burst(), 1);
  TokenBucket slow(/*rate_per_second=*/0.5, /*burst=*/0, kStart);
  EXPECT_TRUE(slow.TryTake(kStart));
  EXPECT_FALSE(slow.TryTake(kStart + absl::Seconds(1)));
  EXPECT_TRUE(slow.TryTake(kStart + absl::Seconds(2)));
}

TEST(TokenBucketTest, NoRateMeansNoLimit) {
  TokenBucket bucket(/*rate_per_second=*/0, /*burst=*/0, kStart);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(bucket.TryTake(kStart));
}

TEST(TokenBucketTest, AClockThatGoesBackRefillsNothing) {
  TokenBucket bucket(/*rate_per_second=*/4, /*burst=*/1, kStart);
  EXPECT_TRUE(bucket.TryTake(kStart));
  EXPECT_FALSE(bucket.TryTake(kStart - absl::Seconds(10)));
  // The refill still counts from the start, not from the earlier reading.
  EXPECT_TRUE(bucket.TryTake(kStart + absl::Milliseconds(250)));
}

}  // namespace
}  // namespace cloister::host
