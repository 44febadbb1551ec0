#include "host/scheduler/scheduler.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "gtest/gtest.h"
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
  return reply;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Start(int max_batch_size, absl::Duration max_queue_delay, int max_in_flight = 2,
             int max_queued_per_tenant = 1024) {
    SchedulerOptions options;
    options.max_batch_size = max_batch_size;
    options.max_queue_delay = max_queue_delay;
    options.max_batches_in_flight = max_in_flight;
    options.max_queued_requests_per_tenant = max_queued_per_tenant;
    options.clock = &clock_;
    auto scheduler = Scheduler::Create(&enclave_, options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  void Submit(const std::string& tenant, const std::string& model, const std::string& request_id,
              absl::Time deadline = absl::InfiniteFuture()) {
    InferRequest request;
    request.tenant_id = tenant;
    request.item.set_session_id("session-" + tenant);
    request.item.set_request_id(request_id);
    request.item.set_model_handle(model);
    request.item.set_ciphertext("c:" + request_id);
    request.deadline = deadline;
    scheduler_->Submit(std::move(request), answers_.For(request_id));
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

  static std::vector<std::string> RequestIds(const HostToEnclave& call) {
    std::vector<std::string> ids;
    for (const auto& item : call.infer_batch().items()) ids.push_back(item.request_id());
    return ids;
  }

  void TearDown() override {
    // Answer whatever is still pending so Stop() can finish.
    std::thread finisher([this] {
      while (scheduler_ != nullptr && scheduler_->batches_in_flight() > 0) {
        enclave_.FailAll(absl::UnavailableError("test over"));
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
    if (scheduler_) scheduler_->Stop();
    finisher.join();
  }

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
  EXPECT_EQ(order, (std::vector<std::string>{"acme", "acme", "globex", "acme"}));
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
  CompleteOldest();
  ASSERT_TRUE(answers_.WaitForTotal(4));
  EXPECT_TRUE(answers_.Of("long")[0].ok());
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

}  // namespace
}  // namespace cloister::host
