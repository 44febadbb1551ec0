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
#include "host/testing/fake_enclave_client.h"

namespace cloister::host {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::SealedReplyItem;
using testing::FakeEnclaveClient;

constexpr char kModelA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kModelB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

// Collects every answer the scheduler gives, by request id.
class Answers {
 public:
  Scheduler::Done For(const std::string& request_id) {
    return [this, request_id](absl::StatusOr<SealedReplyItem> answer) {
      absl::MutexLock lock(&mu_);
      answers_[request_id].push_back(std::move(answer));
      ++total_;
    };
  }
  bool WaitForTotal(int count, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return total_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  int total() {
    absl::MutexLock lock(&mu_);
    return total_;
  }
  std::vector<absl::StatusOr<SealedReplyItem>> Of(const std::string& request_id) {
    absl::MutexLock lock(&mu_);
    return answers_[request_id];
  }
  std::map<std::string, std::vector<absl::StatusOr<SealedReplyItem>>> All() {
    absl::MutexLock lock(&mu_);
    return answers_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::vector<absl::StatusOr<SealedReplyItem>>> answers_ ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

// A successful enclave reply to a batch call: "r:" + each item's ciphertext.
EnclaveToHost ReplyTo(const HostToEnclave& call) {
  EnclaveToHost reply;
  auto* result = reply.mutable_infer_batch();
  for (const auto& item : call.infer_batch().items()) {
    SealedReplyItem* out = result->add_replies();
    out->set_request_id(item.request_id());
    out->set_sequence(item.sequence());
    out->set_ciphertext(absl::StrCat("r:", item.ciphertext()));
  }
  // 1 ms per request, the scheduler's initial estimate: charges need no correction.
  result->set_execution_ns(absl::ToInt64Nanoseconds(absl::Milliseconds(1)) *
                           call.infer_batch().items_size());
  return reply;
}

std::vector<std::string> RequestIds(const HostToEnclave& call) {
  std::vector<std::string> ids;
  for (const auto& item : call.infer_batch().items()) ids.push_back(item.request_id());
  return ids;
}

// Stops `scheduler` while failing every call that `enclave` holds. The failing goes on until
// Stop() has returned, not until batches_in_flight() reads 0: the batcher may dispatch one more
// batch right after that read (a completion freed a slot and requests are still queued), and a
// finisher that had already left would then leave Stop() waiting for it forever.
void StopFailingPending(Scheduler& scheduler, FakeEnclaveClient& enclave) {
  std::atomic<bool> stopped{false};
  std::thread finisher([&] {
    while (!stopped.load()) {
      enclave.FailAll(absl::UnavailableError("test over"));
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  scheduler.Stop();
  stopped.store(true);
  finisher.join();
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Start(int max_batch_size, absl::Duration max_queue_delay, int max_in_flight = 2,
             int max_queued_per_tenant = 1024) {
    SchedulerOptions options = options_;
    options.max_batch_size = max_batch_size;
    options.max_queue_delay = max_queue_delay;
    options.max_batches_in_flight = max_in_flight;
    options.default_limits.max_queued_requests = max_queued_per_tenant;
    options.clock = &clock_;
    auto scheduler = Scheduler::Create(&enclave_, options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  Scheduler::Ticket Submit(const std::string& tenant, const std::string& model,
                           const std::string& request_id,
                           absl::Time deadline = absl::InfiniteFuture(), size_t size = 0) {
    InferRequest request;
    request.tenant_id = tenant;
    request.item.set_session_id("session-" + tenant);
    request.item.set_request_id(request_id);
    request.item.set_model_handle(model);
    request.item.set_ciphertext(size == 0 ? "c:" + request_id : std::string(size, 'x'));
    request.deadline = deadline;
    return scheduler_->Submit(std::move(request), answers_.For(request_id));
  }

  void Advance(absl::Duration duration) {
    clock_.Advance(duration);
    scheduler_->WakeForTest();
  }

  // Completes the oldest pending batch successfully and returns it.
  HostToEnclave CompleteOldest() {
    EXPECT_TRUE(enclave_.WaitForPending(1));
    HostToEnclave call = enclave_.Pending().front();
    EXPECT_TRUE(enclave_.Complete(call.call_id(), ReplyTo(call)));
    return call;
  }

  // A realtime tenant "rt" and a best-effort tenant "be" on one worker that runs one batch at a
  // time, with a 1 ms arrival guard; "rt" sends every 20 ms from 0 to 220 ms (each request runs
  // at once), so by 220 ms its period is trusted.
  void StartWithAPeriodicRealtimeTenant() {
    options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
    options_.tenant_limits["be"].priority = PriorityClass::kBatch;
    options_.realtime_arrival_guard = absl::Milliseconds(1);
    Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
    for (int i = 0; i < 12; ++i) {
      if (i > 0) Advance(absl::Milliseconds(20));
      RealtimeArrivesAndRuns(absl::StrCat("rt", i));
    }
  }
  // Submits a request of "rt" and checks that it is the next batch; completes it.
  void RealtimeArrivesAndRuns(const std::string& id) {
    Submit("rt", kModelB, id);
    EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{id}));
  }
  // Whether no batch was dispatched in 30 ms of real time (the fake clock standing still): the
  // batcher had every chance to send one.
  bool NothingDispatched() {
    absl::SleepFor(absl::Milliseconds(30));
    return enclave_.Pending().empty();
  }

  void TearDown() override {
    // Answer whatever is still pending so Stop() can finish.
    if (scheduler_) StopFailingPending(*scheduler_, enclave_);
  }

  // Options the next Start() begins from.
  SchedulerOptions options_;
  FakeClock clock_;
  FakeEnclaveClient enclave_;
  Answers answers_;
  std::unique_ptr<Scheduler> scheduler_;
};

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
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(enclave_.Pending().size(), 1u);
  Advance(absl::Seconds(10));
  ASSERT_TRUE(enclave_.WaitForPending(2));
  EXPECT_EQ(RequestIds(enclave_.Pending()[1]), (std::vector<std::string>{"r8", "r9"}));
  CompleteOldest();
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(10));
  absl::StatusOr<SealedReplyItem> r9 = answers_.Of("r9").at(0);
  ASSERT_TRUE(r9.ok()) << r9.status();
  EXPECT_EQ(r9->ciphertext(), "r:c:r9");
}

TEST_F(SchedulerTest, PartialBatchFlushesAfterTheQueueDelay) {
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(2));
  Submit("acme", kModelA, "r0");
  Submit("acme", kModelA, "r1");
  Advance(absl::Milliseconds(1));
  Submit("acme", kModelA, "r2");
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_TRUE(enclave_.Pending().empty()) << "flushed before the oldest waited 2 ms";
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
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(enclave_.Pending().empty()) << "request " << sent << " went without waiting";
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
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(enclave_.Pending().empty()) << "globex inherited acme's history";
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
    absl::SleepFor(absl::Milliseconds(10));
    Advance(absl::Milliseconds(2));
    ASSERT_TRUE(enclave_.WaitForPending(1));
    first_batch.push_back(RequestIds(CompleteOldest()).size());
    answered += 3;
    while (!answers_.WaitForTotal(answered, absl::Milliseconds(200))) CompleteOldest();
  }
  EXPECT_EQ(first_batch.front(), 1u) << "the first burst after lone requests did not go at once";
  EXPECT_EQ(first_batch.back(), 3u) << "bursts never batched again";
}

TEST_F(SchedulerTest, AdaptiveQueueDelayCanBeTurnedOff) {
  options_.adaptive_queue_delay = false;
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Milliseconds(2), /*max_in_flight=*/8);
  for (int sent = 0; sent < 8; ++sent) {
    Submit("acme", kModelA, absl::StrCat("r", sent));
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_TRUE(enclave_.Pending().empty()) << "request " << sent << " went without waiting";
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
  absl::SleepFor(absl::Milliseconds(20));
  std::vector<HostToEnclave> pending = enclave_.Pending();
  ASSERT_EQ(pending.size(), 3u);
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
  absl::SleepFor(absl::Milliseconds(20));
  auto all = answers_.All();
  ASSERT_EQ(all.size(), static_cast<size_t>(kCount));
  for (const auto& [request_id, answers] : all) {
    EXPECT_EQ(answers.size(), 1u) << request_id;
  }
  EXPECT_EQ(answers_.total(), kCount);
  EXPECT_EQ(scheduler_->queued_count(), 0);
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
  EXPECT_EQ(enclave_.History()[0].infer_batch().items(0).time_left_ns(), 0);
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items(0).time_left_ns(),
            absl::ToInt64Nanoseconds(absl::Seconds(50) - absl::Milliseconds(10)));
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

// Random operations on a fake clock, with fixed seeds: three tenants of different classes, three
// models, short and no deadlines, cancellations, time passing and batches completing in between,
// beside a periodic realtime sender.
// Every request gets exactly one answer and the scheduler never trips an internal check (the
// run above found queues that expired together aborting it).
TEST_F(SchedulerTest, RandomOperationsGiveEveryRequestExactlyOneAnswer) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const int answered_before = answers_.total();
    options_.tenant_limits["acme"].priority = PriorityClass::kRealtime;
    options_.tenant_limits["initech"].priority = PriorityClass::kBatch;
    options_.tenant_limits["periodic"].priority = PriorityClass::kRealtime;
    Start(/*max_batch_size=*/3, /*max_queue_delay=*/absl::Milliseconds(2), /*max_in_flight=*/2);
    std::mt19937 random(seed);
    const char* tenants[] = {"acme", "globex", "initech"};
    const char* models[] = {kModelA, kModelB, "cccccccccccccccccccccccccccccccc"};
    std::vector<Scheduler::Ticket> tickets;
    std::vector<std::string> ids;
    // Beside the random senders, a realtime tenant that sends every 6 ms of the clock, so the
    // scheduler learns its period and plans best-effort batches around it.
    absl::Time next_periodic = clock_.Now();
    for (int op = 0; op < 300; ++op) {
      for (int late = 0; clock_.Now() >= next_periodic; ++late) {
        const std::string id = absl::StrCat("p", seed, "-", op, "-", late);
        tickets.push_back(Submit("periodic", kModelA, id));
        ids.push_back(id);
        next_periodic += absl::Milliseconds(6);
      }
      switch (random() % 4) {
        case 0:
        case 1: {
          const std::string id = absl::StrCat("s", seed, "-", op);
          absl::Time deadline = absl::InfiniteFuture();
          if (random() % 2 == 0) deadline = clock_.Now() + absl::Milliseconds(random() % 8);
          tickets.push_back(Submit(tenants[random() % 3], models[random() % 3], id, deadline));
          ids.push_back(id);
          break;
        }
        case 2:
          if (!tickets.empty()) scheduler_->Cancel(tickets[random() % tickets.size()]);
          Advance(absl::Milliseconds(random() % 4));
          break;
        case 3:
          if (!enclave_.Pending().empty()) {
            const HostToEnclave call = enclave_.Pending().front();
            enclave_.Complete(call.call_id(), ReplyTo(call));
          }
          break;
      }
    }
    // Drain: time passes and the worker answers until every request has its answer.
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    auto answered = [&] { return answers_.total() - answered_before; };
    while (answered() < static_cast<int>(ids.size()) && absl::Now() < give_up) {
      for (const HostToEnclave& call : enclave_.Pending()) {
        enclave_.Complete(call.call_id(), ReplyTo(call));
      }
      Advance(absl::Milliseconds(5));
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(answered(), static_cast<int>(ids.size()));
    for (const std::string& id : ids) ASSERT_EQ(answers_.Of(id).size(), 1u) << id;
    EXPECT_EQ(scheduler_->queued_count(), 0);
    StopFailingPending(*scheduler_, enclave_);
    scheduler_.reset();
  }
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

TEST_F(SchedulerTest, StopAnswersQueuedRequestsAndWaitsForBatchesInFlight) {
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  for (int i = 0; i < 3; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  std::thread completer([this] {
    absl::SleepFor(absl::Milliseconds(50));
    CompleteOldest();
  });
  scheduler_->Stop();
  // Stop returned only after the batch in flight was answered.
  EXPECT_EQ(answers_.total(), 3);
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
  // The slot is released right after the answers are delivered.
  for (int i = 0; i < 1000 && scheduler_->batches_in_flight() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(scheduler_->batches_in_flight(), 0);
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

TEST_F(SchedulerTest, PreferredBatchSizesShapePartialBatches) {
  options_.preferred_batch_sizes = {2, 4};
  Start(/*max_batch_size=*/8, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/4);
  for (int i = 0; i < 3; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(enclave_.Pending().empty()) << "3 requests make no preferred batch yet";
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

// The operator's cap holds for a request's own deadline too, and what is left of it goes to
// the enclave with the batch.
TEST_F(SchedulerTest, TenantMaxDeadlineCapsEveryDeadline) {
  options_.tenant_limits["acme"].max_deadline = absl::Milliseconds(5);
  options_.tenant_limits["acme"].default_deadline = absl::Seconds(60);
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  Submit("acme", kModelA, "first", clock_.Now() + absl::Seconds(50));
  ASSERT_TRUE(enclave_.WaitForPending(1));
  EXPECT_EQ(enclave_.Pending()[0].infer_batch().items(0).time_left_ns(),
            absl::ToInt64Nanoseconds(absl::Milliseconds(5)));
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
  absl::SleepFor(absl::Milliseconds(20));
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
  absl::SleepFor(absl::Milliseconds(30));  // the batcher had every chance to fill both slots
  ASSERT_EQ(enclave_.Pending().size(), 1u) << "one slot stays free for realtime work";
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
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_TRUE(enclave_.Pending().empty()) << "held back for the realtime request";
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
  Advance(absl::Milliseconds(23));  // 243 ms: due at 240, 3 ms late
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
  Advance(absl::Milliseconds(23));  // 243 ms: due at 240, 3 ms late
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
  Advance(absl::Seconds(2));  // a pause; the stream resumes at 2220 ms
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

// Saturates one worker with several tenants and returns each one's measured execution time over
// the first `batch_count` batches. Tenant i uses model i with cost `item_costs[i]` per request.
std::map<std::string, absl::Duration> RunSaturated(const std::vector<std::string>& tenants,
                                                   const std::vector<int>& weights,
                                                   const std::vector<absl::Duration>& item_costs,
                                                   int batch_count) {
  FakeClock clock;
  FakeEnclaveClient enclave;
  SchedulerOptions options;
  options.max_batch_size = 4;
  options.max_queue_delay = absl::ZeroDuration();
  options.max_batches_in_flight = 1;
  options.clock = &clock;
  std::map<std::string, absl::Duration> cost_of;
  for (size_t i = 0; i < tenants.size(); ++i) {
    options.tenant_limits[tenants[i]].weight = weights[i];
    cost_of[absl::StrCat("model", i)] = item_costs[i];
  }
  auto scheduler = Scheduler::Create(&enclave, options);
  CLOISTER_CHECK(scheduler.ok());
  Answers answers;
  for (int r = 0; r < 1000; ++r) {
    for (size_t i = 0; i < tenants.size(); ++i) {
      std::string id = absl::StrCat(tenants[i], "-", r);
      InferRequest request;
      request.tenant_id = tenants[i];
      request.item.set_request_id(id);
      request.item.set_model_handle(absl::StrCat("model", i));
      request.item.set_ciphertext("c");
      (*scheduler)->Submit(std::move(request), answers.For(id));
    }
  }
  std::map<std::string, absl::Duration> measured;
  for (int b = 0; b < batch_count; ++b) {
    CLOISTER_CHECK(enclave.WaitForPending(1));
    HostToEnclave call = enclave.Pending().front();
    EnclaveToHost reply = ReplyTo(call);
    absl::Duration took =
        cost_of[call.infer_batch().model_handle()] * call.infer_batch().items_size();
    reply.mutable_infer_batch()->set_execution_ns(absl::ToInt64Nanoseconds(took));
    clock.Advance(took);
    measured[call.infer_batch().tenant_id()] += took;
    enclave.Complete(call.call_id(), reply);
  }
  // Saturated throughout: every tenant still has requests queued.
  for (const std::string& tenant : tenants) {
    EXPECT_LT((*scheduler)->StatsFor(tenant).dispatched, 1000u) << tenant;
  }
  StopFailingPending(**scheduler, enclave);
  return measured;
}

void ExpectShares(const std::map<std::string, absl::Duration>& measured,
                  const std::map<std::string, int>& weights) {
  absl::Duration total;
  int weight_total = 0;
  for (const auto& [tenant, time] : measured) total += time;
  for (const auto& [tenant, weight] : weights) weight_total += weight;
  for (const auto& [tenant, weight] : weights) {
    double want = static_cast<double>(weight) / weight_total;
    double got = measured.count(tenant) ? absl::FDivDuration(measured.at(tenant), total) : 0;
    EXPECT_NEAR(got, want, want * 0.1) << tenant;
  }
}

TEST(SchedulerFairnessTest, ExecutionTimeFollowsWeights) {
  // Equal costs, weights 3:1.
  ExpectShares(
      RunSaturated({"acme", "globex"}, {3, 1}, {absl::Milliseconds(1), absl::Milliseconds(1)}, 200),
      {{"acme", 3}, {"globex", 1}});
}

TEST(SchedulerFairnessTest, ExpensiveModelsAreChargedByTime) {
  // globex's model costs 5x acme's per request, and neither matches the initial estimate: with
  // equal weights, both get the same execution time, not the same number of requests.
  ExpectShares(RunSaturated({"acme", "globex"}, {1, 1},
                            {absl::Microseconds(400), absl::Milliseconds(2)}, 150),
               {{"acme", 1}, {"globex", 1}});
}

TEST(SchedulerFairnessTest, ThreeTenantsWithDifferentWeightsAndCosts) {
  ExpectShares(
      RunSaturated({"a", "b", "c"}, {1, 2, 5},
                   {absl::Milliseconds(3), absl::Milliseconds(1), absl::Microseconds(700)}, 250),
      {{"a", 1}, {"b", 2}, {"c", 5}});
}

TEST_F(SchedulerTest, CostEstimateLearnsFromMeasuredBatches) {
  options_.cost_smoothing = 0.5;
  Start(/*max_batch_size=*/2, /*max_queue_delay=*/absl::Seconds(10), /*max_in_flight=*/1);
  EXPECT_EQ(scheduler_->ItemCostEstimate(kModelA), absl::Milliseconds(1));
  for (int i = 0; i < 4; ++i) Submit("acme", kModelA, absl::StrCat("r", i));
  for (absl::Duration per_item : {absl::Milliseconds(4), absl::Milliseconds(2)}) {
    ASSERT_TRUE(enclave_.WaitForPending(1));
    HostToEnclave call = enclave_.Pending().front();
    EnclaveToHost reply = ReplyTo(call);
    reply.mutable_infer_batch()->set_execution_ns(absl::ToInt64Nanoseconds(per_item * 2));
    enclave_.Complete(call.call_id(), reply);
  }
  ASSERT_TRUE(answers_.WaitForTotal(4));
  // The first measurement replaces the initial guess, later ones are smoothed: (4 + 2) / 2.
  for (int i = 0; i < 1000 && scheduler_->batches_in_flight() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(scheduler_->ItemCostEstimate(kModelA), absl::Milliseconds(3));
  EXPECT_EQ(scheduler_->StatsFor("acme").charged_time, absl::Milliseconds(12));
}

TEST(SchedulerWorkersTest, BatchesSpreadOverWorkersAndPinnedRequestsStay) {
  FakeClock clock;
  FakeEnclaveClient first;
  FakeEnclaveClient second;
  SchedulerOptions options;
  options.max_batch_size = 1;
  options.max_queue_delay = absl::ZeroDuration();
  options.max_batches_in_flight = 2;
  options.clock = &clock;
  auto scheduler = Scheduler::Create({&first, &second}, options);
  ASSERT_TRUE(scheduler.ok());
  Answers answers;
  auto submit = [&](const std::string& id, int worker) {
    InferRequest request;
    request.tenant_id = "acme";
    request.item.set_request_id(id);
    request.item.set_model_handle(kModelA);
    request.item.set_ciphertext("c");
    request.worker = worker;
    return (*scheduler)->Submit(std::move(request), answers.For(id));
  };
  for (int i = 0; i < 4; ++i) submit(absl::StrCat("any", i), kAnyWorker);
  ASSERT_TRUE(first.WaitForPending(2));
  ASSERT_TRUE(second.WaitForPending(2));
  EXPECT_EQ((*scheduler)->batches_in_flight(), 4);
  // Both workers are full: pinned requests wait for their own worker only.
  submit("on-second", 1);
  submit("on-first", 0);
  EXPECT_EQ(submit("nowhere", 2), 0u);
  EXPECT_EQ(answers.Of("nowhere")[0].status().code(), absl::StatusCode::kInvalidArgument);
  HostToEnclave call = second.Pending().front();
  second.Complete(call.call_id(), ReplyTo(call));
  ASSERT_TRUE(second.WaitForPending(2));
  EXPECT_EQ(RequestIds(second.Pending().back()), (std::vector<std::string>{"on-second"}));
  EXPECT_EQ(first.Pending().size(), 2u);
  call = first.Pending().front();
  first.Complete(call.call_id(), ReplyTo(call));
  ASSERT_TRUE(first.WaitForPending(2));
  EXPECT_EQ(RequestIds(first.Pending().back()), (std::vector<std::string>{"on-first"}));
  for (FakeEnclaveClient* enclave : {&first, &second}) {
    for (const HostToEnclave& pending : enclave->Pending()) {
      enclave->Complete(pending.call_id(), ReplyTo(pending));
    }
  }
  ASSERT_TRUE(answers.WaitForTotal(7));
  (*scheduler)->Stop();
}

// Random operations over two workers on a fake clock, with fixed seeds: requests pinned to
// either worker or to none, small queue limits (refusals), short deadlines, cancels, and
// batches that complete, fail or come back in any order. Every request gets exactly one answer.
TEST(SchedulerWorkersTest, RandomOperationsGiveEveryRequestExactlyOneAnswer) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    FakeClock clock;
    FakeEnclaveClient workers[2];
    SchedulerOptions options;
    options.max_batch_size = 4;
    options.max_queue_delay = absl::Milliseconds(1);
    options.max_batches_in_flight = 2;
    options.default_limits.max_queued_requests = 6;
    options.tenant_limits["acme"].priority = PriorityClass::kRealtime;
    options.tenant_limits["initech"].priority = PriorityClass::kBatch;
    options.tenant_limits["initech"].weight = 3;
    options.clock = &clock;
    auto scheduler = Scheduler::Create({&workers[0], &workers[1]}, options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    Answers answers;
    std::mt19937 random(seed);
    const char* tenants[] = {"acme", "globex", "initech"};
    const char* models[] = {kModelA, kModelB};
    const int pins[] = {kAnyWorker, 0, 1};
    std::vector<Scheduler::Ticket> tickets;
    int submitted = 0;
    auto answer = [&](FakeEnclaveClient& worker, bool newest) {
      std::vector<HostToEnclave> pending = worker.Pending();
      if (pending.empty()) return;
      const HostToEnclave& call = newest ? pending.back() : pending.front();
      if (random() % 5 == 0) {
        worker.Complete(call.call_id(), absl::UnavailableError("worker restarted"));
      } else {
        worker.Complete(call.call_id(), ReplyTo(call));
      }
    };
    for (int op = 0; op < 300; ++op) {
      switch (random() % 5) {
        case 0:
        case 1: {
          InferRequest request;
          request.tenant_id = tenants[random() % 3];
          const std::string id = absl::StrCat("w", seed, "-", op);
          request.item.set_session_id("session-" + request.tenant_id);
          request.item.set_request_id(id);
          request.item.set_model_handle(models[random() % 2]);
          request.item.set_ciphertext("c");
          request.worker = pins[random() % 3];
          if (random() % 2 == 0) request.deadline = clock.Now() + absl::Milliseconds(random() % 6);
          tickets.push_back((*scheduler)->Submit(std::move(request), answers.For(id)));
          ++submitted;
          break;
        }
        case 2:
          if (!tickets.empty()) (*scheduler)->Cancel(tickets[random() % tickets.size()]);
          break;
        case 3:
          clock.Advance(absl::Milliseconds(random() % 3));
          (*scheduler)->WakeForTest();
          break;
        case 4:
          answer(workers[random() % 2], random() % 2 == 0);
          break;
      }
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (answers.total() < submitted && absl::Now() < give_up) {
      for (FakeEnclaveClient& worker : workers) {
        for (const HostToEnclave& call : worker.Pending()) {
          worker.Complete(call.call_id(), ReplyTo(call));
        }
      }
      clock.Advance(absl::Milliseconds(5));
      (*scheduler)->WakeForTest();
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(answers.total(), submitted);
    for (int op = 0; op < 300; ++op) {
      const std::string id = absl::StrCat("w", seed, "-", op);
      EXPECT_LE(answers.Of(id).size(), 1u) << id;
    }
    EXPECT_EQ((*scheduler)->queued_count(), 0);
    (*scheduler)->Stop();
  }
}

TEST(SchedulerLoadTest, ExactlyOneAnswerPerRequestUnderMixedConcurrentLoad) {
  FakeClock clock;
  std::atomic<int> batches{0};
  // Every fifth batch fails as a whole, every third has its first item refused.
  auto handler = [&batches](const HostToEnclave& call) -> absl::StatusOr<EnclaveToHost> {
    int batch = batches.fetch_add(1);
    if (batch % 5 == 4) return absl::UnavailableError("worker busy");
    EnclaveToHost reply = ReplyTo(call);
    if (batch % 3 == 2) {
      auto* first = reply.mutable_infer_batch()->mutable_replies(0);
      first->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
      first->mutable_status()->set_message("unknown session");
    }
    return reply;
  };
  FunctionEnclaveClient first(handler, /*threads=*/2);
  FunctionEnclaveClient second(handler, /*threads=*/1);
  SchedulerOptions options;
  options.max_batch_size = 4;
  options.preferred_batch_sizes = {2, 4};
  options.max_queue_delay = absl::Microseconds(100);
  options.clock = &clock;
  options.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options.tenant_limits["rt"].max_queued_requests = 20;
  options.tenant_limits["be"].priority = PriorityClass::kBatch;
  options.tenant_limits["be"].weight = 3;
  options.tenant_limits["limited"].rate_per_second = 1000;
  options.tenant_limits["limited"].burst = 5;
  auto scheduler = Scheduler::Create({&first, &second}, options);
  ASSERT_TRUE(scheduler.ok());
  Answers answers;
  const std::vector<std::string> tenants = {"rt", "be", "std", "limited"};
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string id = absl::StrCat("t", t, "-", i);
        InferRequest request;
        request.tenant_id = tenants[(t + i) % tenants.size()];
        request.item.set_request_id(id);
        request.item.set_model_handle(i % 2 ? kModelA : kModelB);
        request.item.set_ciphertext("c");
        request.worker = i % 7 == 0 ? i % 2 : kAnyWorker;
        if (i % 11 == 0) request.deadline = clock.Now() + absl::Microseconds(50);
        Scheduler::Ticket ticket = (*scheduler)->Submit(std::move(request), answers.For(id));
        if (i % 13 == 0 && ticket != 0) (*scheduler)->Cancel(ticket);
        if (i % 3 == 0) clock.Advance(absl::Microseconds(20));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Let the queues drain, then stop (which answers whatever is left).
  for (int i = 0; i < 2000 && (*scheduler)->queued_count() > 0; ++i) {
    clock.Advance(absl::Microseconds(200));
    (*scheduler)->WakeForTest();
    absl::SleepFor(absl::Microseconds(200));
  }
  (*scheduler)->Stop();
  ASSERT_TRUE(answers.WaitForTotal(kThreads * kPerThread));
  absl::SleepFor(absl::Milliseconds(20));
  auto all = answers.All();
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  std::map<absl::StatusCode, int> codes;
  for (const auto& [request_id, list] : all) {
    ASSERT_EQ(list.size(), 1u) << request_id;
    ++codes[list[0].status().code()];
  }
  EXPECT_EQ(answers.total(), kThreads * kPerThread);
  EXPECT_GT(codes[absl::StatusCode::kOk], 0);
  EXPECT_GT(codes[absl::StatusCode::kResourceExhausted], 0);
  EXPECT_GT(codes[absl::StatusCode::kCancelled], 0);
  EXPECT_GT(codes[absl::StatusCode::kUnavailable], 0);
  EXPECT_GT(codes[absl::StatusCode::kNotFound], 0);
}

}  // namespace
}  // namespace cloister::host

namespace cloister::host {
namespace {

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

}  // namespace
}  // namespace cloister::host
