// The Scheduler's priority classes: strict order between them, best-effort caps and reserved
// slots while realtime work is active, and hold-backs and gap-filling around periodic realtime
// tenants.
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

namespace cloister::host::scheduler_test {
namespace {

TEST_F(SchedulerTest, HigherClassesGoFirst) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("std", kModelA, "busy");
  ASSERT_TRUE(enclave_.WaitForPending(1));
  // Queued while the only slot is taken, lowest class first.
  for (int i = 0; i < 2; ++i) Submit("be", kModelA, absl::StrCat("be", i));
  for (int i = 0; i < 2; ++i) Submit("std", kModelA, absl::StrCat("std", i));
  for (int i = 0; i < 2; ++i) Submit("rt", kModelA, absl::StrCat("rt", i));
  std::vector<std::string> order;
  for (int i = 0; i < 7; ++i) order.push_back(RequestIds(CompleteOldest()).at(0));
  EXPECT_EQ(order, (std::vector<std::string>{"busy", "rt0", "rt1", "std0", "std1", "be0", "be1"}));
}

TEST_F(SchedulerTest, BestEffortBatchesShrinkWhileRealtimeWaits) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.best_effort_max_batch_size = 2;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  for (int i = 0; i < 8; ++i) Submit("be", kModelA, absl::StrCat("a", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 8) << "nobody realtime waits";
  for (int i = 0; i < 8; ++i) Submit("be", kModelA, absl::StrCat("b", i));
  Submit("rt", kModelB, "rt0");  // not ready yet (its queue delay runs), but waiting
  CompleteOldest();
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 2);
  Advance(absl::Seconds(10));  // the realtime request is ready: it goes next
  CompleteOldest();
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"rt0"}));
  // Nobody realtime is left: full batches again.
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 6);
}

TEST_F(SchedulerTest, BestEffortStaysCappedShortlyAfterRealtimeActivity) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.best_effort_max_batch_size = 2;
  options_.realtime_activity_window = absl::Seconds(1);
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("rt", kModelB, "rt0");  // dispatched at once; the best-effort requests queue behind it
  ASSERT_TRUE(enclave_.WaitForPending(1));
  for (int i = 0; i < 8; ++i) Submit("be", kModelA, absl::StrCat("a", i));
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"rt0"}));
  // No realtime request is queued, but one arrived just now: best-effort batches stay small.
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 2);
  // Once the realtime tenant has been quiet for the window, full batches again.
  Advance(absl::Seconds(2));
  CompleteOldest();
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 6);
}

// With a slot reserved for realtime work, best-effort batches leave it free while a realtime
// tenant is active, so the next realtime request starts at once; without realtime activity
// every slot is shared again.
TEST_F(SchedulerTest, ReservedSlotKeepsRoomForRealtime) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.realtime_reserved_slots = 1;
  options_.realtime_activity_window = absl::Seconds(1);
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/2);
  RealtimeArrivesAndRuns("rt0");
  for (int i = 0; i < 4; ++i) Submit("be", kModelA, absl::StrCat("b", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  ASSERT_TRUE(NothingDispatched(/*in_flight=*/1)) << "one slot stays free for realtime work";
  Submit("rt", kModelB, "rt1");
  ASSERT_TRUE(enclave_.WaitForPending(2));
  EXPECT_EQ(RequestIds(enclave_.Pending()[1]), (std::vector<std::string>{"rt1"}));
  // The realtime tenant goes quiet for longer than the window: both slots are shared again.
  Advance(absl::Seconds(2));
  EXPECT_TRUE(enclave_.Complete(enclave_.Pending()[1].call_id(), ReplyTo(enclave_.Pending()[1])));
  ASSERT_TRUE(enclave_.WaitForPending(2));
  EXPECT_EQ(RequestIds(enclave_.Pending()[1]), (std::vector<std::string>{"b1"}));
}

// A realtime tenant that sends every 20 ms: a best-effort batch that would still run when its
// next request is due waits for that request, then goes; if the request is overdue by more
// than the guard, the hold ends on its own.
TEST_F(SchedulerTest, BestEffortMakesWayForAPeriodicRealtimeArrival) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.realtime_arrival_guard = absl::Milliseconds(1);
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  for (int i = 0; i < 5; ++i) {  // arrivals at 0, 20, .., 80 ms: a trusted 20 ms period
    if (i > 0) Advance(absl::Milliseconds(20));
    Submit("rt", kModelB, absl::StrCat("rt", i));
    EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{absl::StrCat("rt", i)}));
  }
  Advance(absl::Microseconds(18500));  // 98.5 ms: the next realtime request is due at 100 ms
  Submit("be", kModelA, "b0");         // 1 ms estimated: it would still run then
  EXPECT_TRUE(NothingDispatched()) << "held back for the realtime request";
  Advance(absl::Microseconds(1500));  // 100 ms: it comes and finds the worker free
  RealtimeArrivesAndRuns("rt5");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b0"}));
  // Next due at 120 ms; at 119 ms a best-effort request waits, and the realtime one never
  // comes: once it is overdue beyond the guard and the jitter, the batch goes anyway.
  Advance(absl::Milliseconds(19));
  Submit("be", kModelA, "b1");
  EXPECT_TRUE(NothingDispatched());
  Advance(absl::Milliseconds(10));
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b1"}));
}

// Between the requests of a periodic realtime tenant, a best-effort batch may take as many
// requests as half the time to the next realtime arrival fits (less the guard), above the
// static best-effort cap; near the arrival, fewer.
TEST_F(SchedulerTest, BestEffortFillsTheGapBetweenPeriodicRealtimeRequests) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.realtime_arrival_guard = absl::Milliseconds(1);
  options_.best_effort_max_batch_size = 1;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  // Arrivals every 20 ms from 0 to 220 ms: after eleven equal gaps the period is trusted and
  // its jitter estimate (which starts at half a gap) is down to 0.4 ms.
  for (int i = 0; i < 12; ++i) {
    if (i > 0) Advance(absl::Milliseconds(20));
    Submit("rt", kModelB, absl::StrCat("rt", i));
    if (i == 11) {
      // While rt11 runs, the best-effort tenant queues 10 requests (1 ms each, estimated).
      ASSERT_TRUE(enclave_.WaitForPending(1));
      for (int b = 0; b < 10; ++b) Submit("be", kModelA, absl::StrCat("b", b));
    }
    EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{absl::StrCat("rt", i)}));
  }
  // At 220 ms, 18.6 ms of room before the next request (due at 240 ms, less the guard and the
  // jitter): half of it fits 9 requests, which max_batch_size caps at 8.
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 8);
  // At 233 ms: 5.6 ms of room, so 2 requests, which end before the realtime request is due.
  Advance(absl::Milliseconds(13));
  EXPECT_EQ(RequestIds(CompleteOldest()).size(), 8u);
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 2);
}

// A clock-driven realtime sender whose request came late once keeps its schedule: the next
// one is expected a period after the late one was due, not a period after it came.
TEST_F(SchedulerTest, ALateRealtimeRequestDoesNotShiftTheExpectedSchedule) {
  StartWithAPeriodicRealtimeTenant();  // rt every 20 ms, 0 to 220 ms
  Advance(absl::Milliseconds(23));     // 243 ms: due at 240, 3 ms late
  RealtimeArrivesAndRuns("late");
  // At 259 ms a 1 ms best-effort request would still run at 260 ms, when the sender's next
  // request is due on its schedule (not at 263 ms, a period after the late one): it waits.
  Advance(absl::Milliseconds(16));
  Submit("be", kModelA, "b0");
  EXPECT_TRUE(NothingDispatched()) << "held back for the request due at 260 ms";
  Advance(absl::Milliseconds(1));
  RealtimeArrivesAndRuns("on-time");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b0"}));
}

// A sender whose timer fired 3 ms late once is waited for that much past its due time from then
// on (the guard and the smoothed jitter alone would give up after about 2 ms and let a
// best-effort batch start just before it comes), and no longer than that when it does not come.
TEST_F(SchedulerTest, AHoldBackWaitsAsLongAsTheRealtimeTenantHasLatelyComeLate) {
  StartWithAPeriodicRealtimeTenant();  // rt every 20 ms, 0 to 220 ms
  Advance(absl::Milliseconds(23));     // 243 ms: due at 240, 3 ms late
  RealtimeArrivesAndRuns("late");
  // The next one is due at about 260.8 ms (the smoothed gap took in the 23 ms one). A best-effort
  // request at 259 ms waits, and still waits at 263.5 ms, 2.7 ms overdue.
  Advance(absl::Milliseconds(16));
  Submit("be", kModelA, "b0");
  EXPECT_TRUE(NothingDispatched());
  Advance(absl::Microseconds(4500));
  EXPECT_TRUE(NothingDispatched()) << "still held for a request that comes late lately";
  RealtimeArrivesAndRuns("late-again");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b0"}));
  // Next due at about 281.4 ms. At 280 ms a best-effort request waits; the realtime request
  // never comes, and 4 ms past its due time (the guard and the 3 ms lateness) the batch goes.
  Advance(absl::Microseconds(16500));
  Submit("be", kModelA, "b1");
  EXPECT_TRUE(NothingDispatched());
  Advance(absl::Milliseconds(4));  // 284 ms
  EXPECT_TRUE(NothingDispatched());
  Advance(absl::Milliseconds(2));  // 286 ms
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b1"}));
}

// A realtime stream that pauses and resumes at its old pace is protected from its second request
// on: the pause is a break, not a period to learn (which would cost the period its trust for
// dozens of requests). Three long gaps in a row are a new pace, learnt afresh.
TEST_F(SchedulerTest, ARealtimeStreamThatPausesKeepsItsLearntPeriod) {
  StartWithAPeriodicRealtimeTenant();  // rt every 20 ms, 0 to 220 ms
  Advance(absl::Seconds(2));           // a pause; the stream resumes at 2220 ms
  RealtimeArrivesAndRuns("resumed");
  // Its next request is due at 2240 ms: a 1 ms best-effort request at 2239 ms waits for it.
  Advance(absl::Milliseconds(19));
  Submit("be", kModelA, "b0");
  EXPECT_TRUE(NothingDispatched()) << "the period learnt before the pause still holds";
  Advance(absl::Milliseconds(1));
  RealtimeArrivesAndRuns("on-pace");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b0"}));
  // The sender slows to one request every 60 ms. After the third such gap (2420 ms) the pace
  // is learnt afresh, so nothing is predicted yet: a best-effort request at 2479 ms goes.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Milliseconds(60));
    RealtimeArrivesAndRuns(absl::StrCat("slow", i));
  }
  Advance(absl::Milliseconds(59));
  Submit("be", kModelA, "b1");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b1"}));
  // Once four more 60 ms gaps agree (2480 to 2720 ms), the new period is trusted: a best-effort
  // request at 2779 ms waits for the request due at 2780 ms.
  Advance(absl::Milliseconds(1));
  for (int i = 0; i < 5; ++i) {
    if (i > 0) Advance(absl::Milliseconds(60));
    RealtimeArrivesAndRuns(absl::StrCat("paced", i));
  }
  Advance(absl::Milliseconds(59));
  Submit("be", kModelA, "b2");
  EXPECT_TRUE(NothingDispatched()) << "the new 60 ms period is trusted";
  Advance(absl::Milliseconds(1));
  RealtimeArrivesAndRuns("paced5");
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{"b2"}));
}

TEST_F(SchedulerTest, BestEffortBatchTimeCapUsesTheCostEstimate) {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.best_effort_max_batch_size = 8;
  options_.best_effort_max_batch_time = absl::Milliseconds(3);  // 3 requests at 1 ms each
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  Submit("rt", kModelB, "rt0");
  for (int i = 0; i < 8; ++i) Submit("be", kModelA, absl::StrCat("a", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items_size(), 3);
}

}  // namespace
}  // namespace cloister::host::scheduler_test
