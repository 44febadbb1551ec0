// The Scheduler's admission and queue exits: rate, queue and payload limits, deadlines (the
// request's own, the tenant's default and cap) and cancellation.
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/status.h"
#include "gtest/gtest.h"
#include "host/enclave_client/function_enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "host/scheduler/scheduler_test_util.h"
#include "host/testing/fake_enclave_client.h"
#include "proto/duration.h"

namespace cloister::host::scheduler_test {
namespace {

TEST_F(SchedulerTest, RateLimitIsATokenBucket) {
  options_.tenant_limits["acme"].rate_per_second = 10;
  options_.tenant_limits["acme"].burst = 2;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10));
  EXPECT_NE(Submit("acme", kModelA, "r0"), 0u);
  EXPECT_NE(Submit("acme", kModelA, "r1"), 0u);
  EXPECT_EQ(Submit("acme", kModelA, "r2"), 0u);
  ASSERT_EQ(answers_.Of("r2").size(), 1u);
  EXPECT_EQ(answers_.Of("r2")[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(answers_.Of("r2")[0].status().message(),
            "tenant acme: rate limit 10 requests/s exceeded (burst 2); retry later");
  EXPECT_NE(Submit("globex", kModelA, "g0"), 0u) << "other tenants have their own bucket";
  clock_.Advance(absl::Milliseconds(100));  // one token back
  EXPECT_NE(Submit("acme", kModelA, "r3"), 0u);
  EXPECT_EQ(Submit("acme", kModelA, "r4"), 0u);
  EXPECT_EQ(scheduler_->StatsFor("acme").refused, 2u);
  EXPECT_EQ(scheduler_->StatsFor("acme").admitted, 3u);
}

TEST_F(SchedulerTest, QueueAndPayloadLimitsNameTheLimit) {
  options_.tenant_limits["acme"].max_queued_size = 100;
  options_.tenant_limits["acme"].max_payload_size = 80;
  options_.tenant_limits["acme"].max_queued_requests = 5;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10));
  EXPECT_EQ(Submit("acme", kModelA, "big", absl::InfiniteFuture(), 81), 0u);
  EXPECT_EQ(answers_.Of("big")[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(answers_.Of("big")[0].status().message(),
            "tenant acme: payload of 81 bytes exceeds the limit of 80 bytes");
  EXPECT_NE(Submit("acme", kModelA, "r0", absl::InfiniteFuture(), 60), 0u);
  EXPECT_EQ(Submit("acme", kModelA, "r1", absl::InfiniteFuture(), 41), 0u);
  EXPECT_EQ(answers_.Of("r1")[0].status().message(),
            "tenant acme: queued-bytes limit of 100 bytes reached; retry later");
  for (int i = 2; i < 6; ++i) {
    EXPECT_NE(Submit("acme", kModelA, absl::StrCat("r", i), absl::InfiniteFuture(), 10), 0u);
  }
  EXPECT_EQ(Submit("acme", kModelA, "r6", absl::InfiniteFuture(), 1), 0u);
  EXPECT_EQ(answers_.Of("r6")[0].status().message(),
            "tenant acme: queue limit of 5 requests reached; retry later");
  EXPECT_EQ(scheduler_->queued_count(), 5);
}

TEST_F(SchedulerTest, TenantQueueLimitIsResourceExhausted) {
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/2,
        /*max_queued_per_tenant=*/3);
  for (int i = 0; i < 4; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  Submit("globex", kModelA, "g0");  // another tenant is not affected
  ASSERT_TRUE(answers_.WaitForTotal(1));
  EXPECT_EQ(answers_.Of("r3")[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler_->queued_count(), 4);
}

TEST_F(SchedulerTest, QueuedRequestsPastTheirDeadlineAreAnswered) {
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("acme", kModelA, "busy");
  ASSERT_TRUE(enclave_.WaitForPending(1));
  // The only slot is taken, so these wait in the queue.
  Submit("acme", kModelA, "short", clock_.Now() + absl::Milliseconds(5));
  Submit("acme", kModelA, "long", clock_.Now() + absl::Seconds(50));
  Submit("acme", kModelA, "already", clock_.Now() - absl::Milliseconds(1));
  ASSERT_TRUE(answers_.WaitForTotal(1));
  EXPECT_EQ(answers_.Of("already")[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  Advance(absl::Milliseconds(10));
  ASSERT_TRUE(answers_.WaitForTotal(2));
  EXPECT_EQ(answers_.Of("short")[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(answers_.Of("long").empty());
  EXPECT_EQ(scheduler_->queued_count(), 1);
  CompleteOldest();
  // The enclave learns how long each request may still run: none for "busy", and what is left
  // of its 50 s for "long", sent 10 ms in.
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_FALSE(enclave_.History()[0].infer_batch().items(0).has_time_left());
  EXPECT_EQ(proto::FromProtoDuration(enclave_.Pending()[0].infer_batch().items(0).time_left()),
            absl::Seconds(50) - absl::Milliseconds(10));
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(4));
  EXPECT_TRUE(answers_.Of("long")[0].ok());
}

// A tenant whose queues for two models all expire at the same moment: each queue is retired
// and the tenant leaves its ring once, and the scheduler goes on serving. (Found by the TSan
// load run: the first retirement checked that the tenant had no queue left while the second,
// just as empty, was still waiting its turn, and cloisterd aborted.)
TEST_F(SchedulerTest, QueuesOfOneTenantThatExpireTogetherAreAllRetired) {
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("acme", kModelA, "busy");
  ASSERT_TRUE(enclave_.WaitForPending(1));
  const absl::Time deadline = clock_.Now() + absl::Milliseconds(5);
  Submit("acme", kModelA, "a", deadline);
  Submit("acme", kModelB, "b", deadline);
  Advance(absl::Milliseconds(10));
  ASSERT_TRUE(answers_.WaitForTotal(2));
  EXPECT_EQ(answers_.Of("a")[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answers_.Of("b")[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(scheduler_->queued_count(), 0);
  // The tenant comes back with new work on both models, and all of it runs.
  Submit("acme", kModelB, "b2");
  Submit("acme", kModelA, "a2");
  CompleteOldest();
  ASSERT_TRUE(enclave_.WaitForPending(1));
  CompleteOldest();
  ASSERT_TRUE(enclave_.WaitForPending(1));
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(5));
  EXPECT_TRUE(answers_.Of("busy")[0].ok());
  EXPECT_TRUE(answers_.Of("a2")[0].ok());
  EXPECT_TRUE(answers_.Of("b2")[0].ok());
}

// The operator's cap holds for a request's own deadline too, and what is left of it goes to
// the enclave with the batch.
TEST_F(SchedulerTest, TenantMaxDeadlineCapsEveryDeadline) {
  options_.tenant_limits["acme"].max_deadline = absl::Milliseconds(5);
  options_.tenant_limits["acme"].default_deadline = absl::Seconds(60);
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("acme", kModelA, "first", clock_.Now() + absl::Seconds(50));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(proto::FromProtoDuration(enclave_.Pending()[0].infer_batch().items(0).time_left()),
            absl::Milliseconds(5));
  Submit("acme", kModelA, "own", clock_.Now() + absl::Seconds(50));  // waits for the slot
  Submit("acme", kModelA, "default");
  Advance(absl::Milliseconds(6));
  ASSERT_TRUE(answers_.WaitForTotal(2));
  for (const char* id : {"own", "default"}) {
    EXPECT_EQ(answers_.Of(id)[0].status().code(), absl::StatusCode::kDeadlineExceeded) << id;
  }
  EXPECT_EQ(answers_.Of("own")[0].status().message(),
            "tenant acme: request waited in the queue past its deadline (6ms)");
}

TEST_F(SchedulerTest, TenantDefaultDeadlineAppliesWithoutOne) {
  options_.tenant_limits["acme"].default_deadline = absl::Milliseconds(5);
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10));
  Submit("acme", kModelA, "default");
  Submit("acme", kModelA, "own", clock_.Now() + absl::Seconds(1));
  Submit("globex", kModelA, "unlimited");
  Advance(absl::Milliseconds(6));
  ASSERT_TRUE(answers_.WaitForTotal(1));
  // The other two are still queued, and a pass at this time neither expires nor sends them.
  EXPECT_TRUE(NothingDispatched());
  EXPECT_EQ(scheduler_->queued_count(), 2);
  EXPECT_EQ(answers_.total(), 1);
  EXPECT_EQ(answers_.Of("default")[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answers_.Of("default")[0].status().message(),
            "tenant acme: request waited in the queue past its deadline (6ms)");
  EXPECT_EQ(scheduler_->StatsFor("acme").expired, 1u);
  EXPECT_TRUE(enclave_.Pending().empty()) << "an expired request is never executed";
}

TEST_F(SchedulerTest, CancelRemovesAQueuedRequestOnly) {
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  Scheduler::Ticket r0 = Submit("acme", kModelA, "r0");
  Submit("acme", kModelA, "r1");
  ASSERT_TRUE(enclave_.WaitForPending(1));
  Scheduler::Ticket r2 = Submit("acme", kModelA, "r2");
  Submit("acme", kModelA, "r3");
  Submit("acme", kModelA, "r4");
  EXPECT_FALSE(scheduler_->Cancel(r0)) << "already with the worker";
  EXPECT_TRUE(scheduler_->Cancel(r2));
  EXPECT_FALSE(scheduler_->Cancel(r2)) << "answered once";
  ASSERT_EQ(answers_.Of("r2").size(), 1u);
  EXPECT_EQ(answers_.Of("r2")[0].status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(scheduler_->queued_count(), 2);
  CompleteOldest();
  HostToEnclave next = CompleteOldest();
  EXPECT_EQ(RequestIds(next), (std::vector<std::string>{"r3", "r4"}));
  ASSERT_TRUE(answers_.WaitForTotal(5));
  EXPECT_TRUE(answers_.Of("r0")[0].ok());
  EXPECT_EQ(answers_.Of("r2").size(), 1u);
  EXPECT_EQ(scheduler_->StatsFor("acme").cancelled, 1u);
}

}  // namespace
}  // namespace cloister::host::scheduler_test
