// The Scheduler's batching, answers and shutdown: when queues are sent, what a batch holds, how
// enclave replies and failures become answers, and Stop().
#include "host/scheduler/scheduler.h"

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
#include "host/scheduler/scheduler_test_util.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host::scheduler_test {
namespace {

TEST_F(SchedulerTest, RefusesBadOptions) {
  SchedulerOptions options;
  options.max_batch_size = 0;
  EXPECT_EQ(Scheduler::Create(&enclave_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = SchedulerOptions();
  options.max_queue_delay = absl::Seconds(11);
  EXPECT_EQ(Scheduler::Create(&enclave_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = SchedulerOptions();
  options.max_batches_in_flight = 0;
  EXPECT_EQ(Scheduler::Create(&enclave_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create(nullptr, SchedulerOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, RefusesBadPolicyOptions) {
  auto code_of = [this](const SchedulerOptions& options) {
    return Scheduler::Create(&enclave_, options).status();
  };
  SchedulerOptions options;
  options.preferred_batch_sizes = {4, 2};
  EXPECT_EQ(code_of(options).code(), absl::StatusCode::kInvalidArgument);
  options.preferred_batch_sizes = {2, 16};  // above max_batch_size 8
  EXPECT_EQ(code_of(options).code(), absl::StatusCode::kInvalidArgument);
  options = SchedulerOptions();
  options.best_effort_max_batch_size = 0;
  EXPECT_EQ(code_of(options).code(), absl::StatusCode::kInvalidArgument);
  options = SchedulerOptions();
  options.tenant_limits["acme"].weight = 0;
  EXPECT_EQ(code_of(options).message(), "tenant acme: weight must be in 1..10000, got 0");
  options = SchedulerOptions();
  options.default_limits.default_deadline = absl::ZeroDuration();
  EXPECT_EQ(code_of(options).code(), absl::StatusCode::kInvalidArgument);
  options = SchedulerOptions();
  options.cost_smoothing = 0;
  EXPECT_EQ(code_of(options).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create(std::vector<EnclaveClient*>{}, SchedulerOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, FullQueueIsBatchedAtMaxSizeWithoutWaiting) {
  Start(/*max_batch_size=*/4, /*max_queue_delay=*/absl::Seconds(10));
  for (int i = 0; i < 10; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  // Two full batches go out at once (the in-flight limit is 2); the clock never moved.
  ASSERT_TRUE(enclave_.WaitForPending(2));
  std::vector<HostToEnclave> pending = enclave_.Pending();
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(RequestIds(pending[0]), (std::vector<std::string>{"r0", "r1", "r2", "r3"}));
  EXPECT_EQ(RequestIds(pending[1]), (std::vector<std::string>{"r4", "r5", "r6", "r7"}));
  EXPECT_EQ(pending[0].infer_batch().tenant_id(), "acme");
  EXPECT_EQ(pending[0].infer_batch().model_handle(), kModelA);
  EXPECT_EQ(scheduler_->batches_in_flight(), 2);
  EXPECT_EQ(scheduler_->queued_count(), 2);

  // The two left over are not a full batch: they wait for the delay, even with a slot free.
  CompleteOldest();
  EXPECT_TRUE(NothingDispatched(/*in_flight=*/1));
  Advance(absl::Seconds(10));
  ASSERT_TRUE(enclave_.WaitForPending(2));
  EXPECT_EQ(RequestIds(enclave_.Pending()[1]), (std::vector<std::string>{"r8", "r9"}));
  CompleteOldest();
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(10));
  absl::StatusOr<EnclaveReply> r9 = answers_.Of("r9").at(0);
  ASSERT_TRUE(r9.ok()) << r9.status();
  EXPECT_EQ(r9->ciphertext(), "r:c:r9");
}

TEST_F(SchedulerTest, PartialBatchFlushesAfterTheQueueDelay) {
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(2));
  Submit("acme", kModelA, "r0");
  Submit("acme", kModelA, "r1");
  Advance(absl::Milliseconds(1));
  Submit("acme", kModelA, "r2");
  EXPECT_TRUE(NothingDispatched()) << "flushed before the oldest waited 2 ms";
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(RequestIds(enclave_.Pending()[0]), (std::vector<std::string>{"r0", "r1", "r2"}));
}

TEST_F(SchedulerTest, LoneArrivalsStopWaitingForCompanyAndBurstsBatchAgain) {
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(2), /*max_in_flight=*/8);
  // A closed-loop client: each request comes 30 ms after the last, so none has company. The
  // first three wait out the delay (not enough history yet); after that they go at once.
  int sent = 0;
  for (; sent < 3; ++sent) {
    Submit("acme", kModelA, absl::StrCat("r", sent));
    EXPECT_TRUE(NothingDispatched()) << "request " << sent << " went without waiting";
    Advance(absl::Milliseconds(2));
    ASSERT_TRUE(enclave_.WaitForPending(1));
    CompleteOldest();
    Advance(absl::Milliseconds(28));
  }
  for (; sent < 12; ++sent) {
    Submit("acme", kModelA, absl::StrCat("r", sent));
    ASSERT_TRUE(enclave_.WaitForPending(1)) << "request " << sent << " waited for company";
    EXPECT_EQ(RequestIds(CompleteOldest()).size(), 1u);
    Advance(absl::Milliseconds(30));
  }
  // Another tenant's history is its own: globex's first request waits.
  Submit("globex", kModelA, "g0");
  EXPECT_TRUE(NothingDispatched()) << "globex inherited acme's history";
  Advance(absl::Milliseconds(2));
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(13));

  // acme turns bursty: three requests at a time, 30 ms apart. Its share of close arrivals
  // climbs back over a quarter, and then a burst waits for its company and goes as one batch.
  std::vector<size_t> first_batch;
  int answered = 13;
  for (int burst = 0; burst < 6; ++burst) {
    Advance(absl::Milliseconds(30));
    for (int i = 0; i < 3; ++i) Submit("acme", kModelA, absl::StrCat("b", burst, "-", i));
    scheduler_->PollForTest(clock_.Now());  // whatever is ready before the delay goes first
    Advance(absl::Milliseconds(2));
    ASSERT_TRUE(enclave_.WaitForPending(1));
    first_batch.push_back(RequestIds(CompleteOldest()).size());
    answered += 3;
    // The rest of the burst, if it went as a second batch once the delay passed.
    while (answers_.total() < answered) {
      ASSERT_TRUE(enclave_.WaitForPending(1)) << "burst " << burst << " was not sent in full";
      CompleteOldest();
    }
  }
  EXPECT_EQ(first_batch.front(), 1u) << "the first burst after lone requests did not go at once";
  EXPECT_EQ(first_batch.back(), 3u) << "bursts never batched again";
}

TEST_F(SchedulerTest, AdaptiveQueueDelayCanBeTurnedOff) {
  options_.adaptive_queue_delay = false;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(2), /*max_in_flight=*/8);
  for (int sent = 0; sent < 8; ++sent) {
    Submit("acme", kModelA, absl::StrCat("r", sent));
    EXPECT_TRUE(NothingDispatched()) << "request " << sent << " went without waiting";
    Advance(absl::Milliseconds(2));
    CompleteOldest();
    Advance(absl::Milliseconds(28));
  }
}

TEST_F(SchedulerTest, ABatchHoldsOneTenantAndOneModel) {
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(1), /*max_in_flight=*/8);
  Submit("acme", kModelA, "acme-a-0");
  Submit("globex", kModelA, "globex-a-0");
  Submit("acme", kModelB, "acme-b-0");
  Submit("acme", kModelA, "acme-a-1");
  Submit("globex", kModelA, "globex-a-1");
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(enclave_.WaitForPending(3));
  ASSERT_TRUE(NothingDispatched(/*in_flight=*/3)) << "more than one batch per tenant and model";
  std::vector<HostToEnclave> pending = enclave_.Pending();
  std::map<std::string, std::vector<std::string>> batches;
  for (const HostToEnclave& call : pending) {
    const auto& batch = call.infer_batch();
    for (const auto& item : batch.items()) {
      // Every item matches its batch's tenant and model.
      EXPECT_EQ(item.model_handle(), batch.model_handle());
      EXPECT_EQ(item.session_id(), "session-" + batch.tenant_id());
    }
    batches[batch.tenant_id() + "/" + batch.model_handle().substr(0, 1)] = RequestIds(call);
  }
  EXPECT_EQ(batches["acme/a"], (std::vector<std::string>{"acme-a-0", "acme-a-1"}));
  EXPECT_EQ(batches["globex/a"], (std::vector<std::string>{"globex-a-0", "globex-a-1"}));
  EXPECT_EQ(batches["acme/b"], (std::vector<std::string>{"acme-b-0"}));
}

TEST_F(SchedulerTest, ReadyQueuesAreServedRoundRobin) {
  Start(/*max_batch_size=*/4, /*max_queue_delay=*/absl::Milliseconds(1), /*max_in_flight=*/1);
  for (int i = 0; i < 12; ++i) Submit("acme", kModelA, absl::StrCat("a", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  Submit("globex", kModelA, "g0");
  Advance(absl::Milliseconds(1));
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) order.push_back(CompleteOldest().infer_batch().tenant_id());
  // FIFO would starve globex until acme's queue is empty (acme, acme, acme, globex).
  EXPECT_EQ(order, (std::vector<std::string>{"acme", "globex", "acme", "acme"}));
}

TEST_F(SchedulerTest, PreferredBatchSizesShapePartialBatches) {
  options_.preferred_batch_sizes = {2, 4};
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/4);
  for (int i = 0; i < 3; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  EXPECT_TRUE(NothingDispatched()) << "3 requests make no preferred batch yet";
  Submit("acme", kModelA, "r3");  // 4: the largest preferred size goes at once
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(RequestIds(enclave_.Pending()[0]), (std::vector<std::string>{"r0", "r1", "r2", "r3"}));
  for (int i = 4; i < 7; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  Advance(absl::Seconds(10));
  // After the delay: the largest preferred size that fits (2), then the rest (1).
  ASSERT_TRUE(enclave_.WaitForPending(3));
  std::vector<HostToEnclave> pending = enclave_.Pending();
  EXPECT_EQ(RequestIds(pending[1]), (std::vector<std::string>{"r4", "r5"}));
  EXPECT_EQ(RequestIds(pending[2]), (std::vector<std::string>{"r6"}));
}

TEST_F(SchedulerTest, EveryRequestGetsExactlyOneAnswer) {
  Start(/*max_batch_size=*/3, /*max_queue_delay=*/absl::Milliseconds(1), /*max_in_flight=*/2);
  const std::vector<std::string> tenants = {"acme", "globex", "initech"};
  const int kCount = 60;
  for (int i = 0; i < kCount; ++i) {
    Submit(tenants[i % 3], i % 2 ? kModelA : kModelB, absl::StrCat("r", i));
  }
  Advance(absl::Milliseconds(1));
  int batches = 0;
  while (answers_.total() < kCount) {
    if (!enclave_.WaitForPending(1, absl::Seconds(5))) break;
    HostToEnclave call = enclave_.Pending().front();
    EnclaveToHost reply = ReplyTo(call);
    // Alternate outcomes: a whole-batch failure, one item refused, plain success.
    if (batches % 3 == 0) {
      enclave_.Complete(call.call_id(), absl::UnavailableError("worker busy"));
    } else {
      if (batches % 3 == 1) {
        auto* first = reply.mutable_infer_batch()->mutable_replies(0);
        first->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
        first->mutable_status()->set_message("unknown session");
      }
      enclave_.Complete(call.call_id(), reply);
    }
    ++batches;
    Advance(absl::Milliseconds(1));
  }
  ASSERT_TRUE(answers_.WaitForTotal(kCount));
  EXPECT_EQ(scheduler_->queued_count(), 0);
  // Once Stop() has returned no callback is left to run: a second answer would be counted now.
  StopFailingPending(*scheduler_, enclave_);
  auto all = answers_.All();
  ASSERT_EQ(all.size(), static_cast<size_t>(kCount));
  for (const auto& [request_id, answers] : all) {
    EXPECT_EQ(answers.size(), 1u) << request_id;
  }
  EXPECT_EQ(answers_.total(), kCount);
}

TEST_F(SchedulerTest, WorkerErrorFailsEveryRequestInTheBatch) {
  Start(/*max_batch_size=*/4, /*max_queue_delay=*/absl::Seconds(10));
  for (int i = 0; i < 4; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  enclave_.Complete(enclave_.Pending()[0].call_id(),
                    absl::UnavailableError("enclave worker exited"));
  ASSERT_TRUE(answers_.WaitForTotal(4));
  for (int i = 0; i < 4; ++i) {
    auto answers = answers_.Of(absl::StrCat("r", i));
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(answers[0].status().message(), "enclave worker exited");
  }
}

TEST_F(SchedulerTest, EnclaveStatusAndMalformedRepliesBecomeErrors) {
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/2);
  for (int i = 0; i < 4; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  ASSERT_TRUE(enclave_.WaitForPending(2));
  std::vector<HostToEnclave> pending = enclave_.Pending();
  // A boundary status on the whole reply.
  EnclaveToHost refused;
  refused.mutable_status()->set_code(static_cast<int>(absl::StatusCode::kPermissionDenied));
  refused.mutable_status()->set_message("batch mixes tenants");
  enclave_.Complete(pending[0].call_id(), refused);
  // One reply for a batch of two.
  EnclaveToHost short_reply = ReplyTo(pending[1]);
  short_reply.mutable_infer_batch()->mutable_replies()->RemoveLast();
  enclave_.Complete(pending[1].call_id(), short_reply);
  ASSERT_TRUE(answers_.WaitForTotal(4));
  EXPECT_EQ(answers_.Of("r0")[0].status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(answers_.Of("r0")[0].status().message(), "batch mixes tenants");
  EXPECT_EQ(answers_.Of("r1")[0].status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(answers_.Of("r2")[0].status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(answers_.Of("r3")[0].status().code(), absl::StatusCode::kInternal);
}

TEST_F(SchedulerTest, RepliesInTheWrongOrderAreRefused) {
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10));
  Submit("acme", kModelA, "r0");
  Submit("acme", kModelA, "r1");
  ASSERT_TRUE(enclave_.WaitForPending(1));
  HostToEnclave call = enclave_.Pending()[0];
  EnclaveToHost reply = ReplyTo(call);
  reply.mutable_infer_batch()->mutable_replies()->SwapElements(0, 1);
  enclave_.Complete(call.call_id(), reply);
  ASSERT_TRUE(answers_.WaitForTotal(2));
  EXPECT_EQ(answers_.Of("r0")[0].status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(answers_.Of("r1")[0].status().code(), absl::StatusCode::kInternal);
}

TEST_F(SchedulerTest, StopAnswersQueuedRequestsAndWaitsForBatchesInFlight) {
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  for (int i = 0; i < 3; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  std::atomic<bool> stop_returned{false};
  std::thread completer([&] {
    // r2's answer comes from Stop(), which then waits for the batch in flight.
    ASSERT_TRUE(answers_.WaitForTotal(1));
    EXPECT_FALSE(stop_returned.load()) << "Stop() returned with a batch in flight";
    CompleteOldest();
  });
  scheduler_->Stop();
  const int answered = answers_.total();
  stop_returned.store(true);
  // Stop returned only after the batch in flight was answered.
  EXPECT_EQ(answered, 3);
  completer.join();
  EXPECT_TRUE(answers_.Of("r0")[0].ok());
  EXPECT_TRUE(answers_.Of("r1")[0].ok());
  EXPECT_EQ(answers_.Of("r2")[0].status().code(), absl::StatusCode::kUnavailable);
  Submit("acme", kModelA, "late");
  EXPECT_EQ(answers_.Of("late")[0].status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(SchedulerTest, DeadWorkerAnswersAtOnce) {
  enclave_.SetDead();
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10));
  Submit("acme", kModelA, "r0");
  Submit("acme", kModelA, "r1");
  ASSERT_TRUE(answers_.WaitForTotal(2));
  EXPECT_EQ(answers_.Of("r0")[0].status().code(), absl::StatusCode::kUnavailable);
  // The full batch went out inside the second Submit() on this thread and the dead worker
  // answered it inside Call(): the slot was released right after the answers were delivered.
  EXPECT_EQ(scheduler_->batches_in_flight(), 0);
}

// The metrics hook sees each finished batch's tenant, class, size, waits and time; the queue
// snapshot counts each tenant's queued requests.
TEST_F(SchedulerTest, BatchObservationsAndQueueSnapshotForMetrics) {
  absl::Mutex mu;
  std::vector<BatchObservation> seen;
  options_.on_batch_done = [&](const BatchObservation& batch) {
    absl::MutexLock lock(&mu);
    seen.push_back(batch);
  };
  options_.tenant_limits["acme"].priority = PriorityClass::kRealtime;
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  Submit("acme", kModelA, "a0");
  Advance(absl::Milliseconds(3));
  Submit("acme", kModelA, "a1");  // a full batch: dispatched at once
  Submit("bravo", kModelA, "b0");
  ASSERT_TRUE(enclave_.WaitForPending(1));

  std::vector<Scheduler::TenantQueueState> queues = scheduler_->TenantQueues();
  ASSERT_EQ(queues.size(), 2u);
  EXPECT_EQ(queues[0].tenant_id, "acme");
  EXPECT_EQ(queues[0].queued_count, 0);
  EXPECT_EQ(queues[0].stats.dispatched, 2u);
  EXPECT_EQ(queues[1].tenant_id, "bravo");
  EXPECT_EQ(queues[1].queued_count, 1);
  EXPECT_EQ(scheduler_->InFlightPerWorker(), std::vector<int>{1});

  Advance(absl::Milliseconds(5));
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(2));
  absl::MutexLock lock(&mu);
  // The hook runs after the answers, on the completion thread.
  auto one_seen = [&seen]() { return !seen.empty(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one_seen), absl::Seconds(10)));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].tenant_id, "acme");
  EXPECT_EQ(seen[0].priority, PriorityClass::kRealtime);
  EXPECT_EQ(seen[0].count, 2);
  EXPECT_TRUE(seen[0].ok);
  EXPECT_EQ(seen[0].queue_waits,
            (std::vector<absl::Duration>{absl::Milliseconds(3), absl::ZeroDuration()}));
  EXPECT_EQ(seen[0].execution, absl::Milliseconds(5));
}

// The reply hook (cloisterd keeps the usage receipts with it) sees every batch's raw reply, a
// failed one too, on the completion thread before that batch's requests are answered.
TEST_F(SchedulerTest, ReplyHookSeesEveryRawReplyBeforeTheAnswers) {
  struct Seen {
    int worker;
    bool ok;
    int replies;
    int answered_before;
  };
  absl::Mutex mu;
  std::vector<Seen> seen;
  options_.on_batch_reply = [&](int worker, const EnclaveClient::Reply& reply) {
    absl::MutexLock lock(&mu);
    seen.push_back({worker, reply.ok(), reply.ok() ? reply->infer_batch().replies_size() : 0,
                    answers_.total()});
  };
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  for (int i = 0; i < 4; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  CompleteOldest();
  ASSERT_TRUE(enclave_.WaitForPending(1));
  enclave_.Complete(enclave_.Pending()[0].call_id(), absl::UnavailableError("worker exited"));
  ASSERT_TRUE(answers_.WaitForTotal(4));
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].worker, 0);
  EXPECT_TRUE(seen[0].ok);
  EXPECT_EQ(seen[0].replies, 2);
  EXPECT_EQ(seen[0].answered_before, 0);
  EXPECT_FALSE(seen[1].ok);
  EXPECT_EQ(seen[1].answered_before, 2);
}

}  // namespace
}  // namespace cloister::host::scheduler_test
