#include "host/scheduler/scheduler_test_util.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace cloister::host::scheduler_test {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::EnclaveReply;

Scheduler::Done Answers::For(const std::string& request_id) {
  return [this, request_id](absl::StatusOr<EnclaveReply> answer) {
    absl::MutexLock lock(&mu_);
    answers_[request_id].push_back(std::move(answer));
    ++total_;
  };
}

bool Answers::WaitForTotal(int count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return total_ >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int Answers::total() {
  absl::MutexLock lock(&mu_);
  return total_;
}

std::vector<absl::StatusOr<EnclaveReply>> Answers::Of(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  return answers_[request_id];
}

std::map<std::string, std::vector<absl::StatusOr<EnclaveReply>>> Answers::All() {
  absl::MutexLock lock(&mu_);
  return answers_;
}

EnclaveToHost ReplyTo(const HostToEnclave& call) {
  EnclaveToHost reply;
  auto* result = reply.mutable_infer_batch();
  for (const auto& item : call.infer_batch().items()) {
    EnclaveReply* out = result->add_replies();
    out->set_request_id(item.request_id());
    out->set_sequence(item.sequence());
    out->set_ciphertext(absl::StrCat("r:", item.ciphertext()));
  }
  result->set_execution_ns(absl::ToInt64Nanoseconds(absl::Milliseconds(1)) *
                           call.infer_batch().items_size());
  return reply;
}

std::vector<std::string> RequestIds(const HostToEnclave& call) {
  std::vector<std::string> ids;
  for (const auto& item : call.infer_batch().items()) ids.push_back(item.request_id());
  return ids;
}

void StopFailingPending(Scheduler& scheduler, testing::FakeEnclaveClient& enclave) {
  // Dead first: a call made after this fails at once, one made before is pending and fails
  // here, so none is left for Stop() to wait for.
  enclave.SetDead();
  enclave.FailAll(absl::UnavailableError("test over"));
  scheduler.Stop();
}

void SchedulerTest::Start(int max_batch_size, absl::Duration max_queue_delay, int max_in_flight,
                          int max_queued_per_tenant) {
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

Scheduler::Ticket SchedulerTest::Submit(const std::string& tenant, const std::string& model,
                                        const std::string& request_id, absl::Time deadline,
                                        size_t size) {
  InferRequest request;
  request.tenant_id = tenant;
  request.item.set_session_id("session-" + tenant);
  request.item.set_request_id(request_id);
  request.item.set_model_handle(model);
  request.item.set_ciphertext(size == 0 ? "c:" + request_id : std::string(size, 'x'));
  request.deadline = deadline;
  return scheduler_->Submit(std::move(request), answers_.For(request_id));
}

void SchedulerTest::Advance(absl::Duration duration) {
  clock_.Advance(duration);
  scheduler_->WakeForTest();
}

HostToEnclave SchedulerTest::CompleteOldest() {
  if (!enclave_.WaitForPending(1)) {
    ADD_FAILURE() << "no batch was dispatched";
    return HostToEnclave();
  }
  HostToEnclave call = enclave_.Pending().front();
  EXPECT_TRUE(enclave_.Complete(call.call_id(), ReplyTo(call)));
  return call;
}

void SchedulerTest::StartWithAPeriodicRealtimeTenant() {
  options_.tenant_limits["rt"].priority = PriorityClass::kRealtime;
  options_.tenant_limits["be"].priority = PriorityClass::kBatch;
  options_.realtime_arrival_guard = absl::Milliseconds(1);
  Start(/*max_batch_size=*/1, /*max_queue_delay=*/absl::ZeroDuration(), /*max_in_flight=*/1);
  for (int i = 0; i < 12; ++i) {
    if (i > 0) Advance(absl::Milliseconds(20));
    RealtimeArrivesAndRuns(absl::StrCat("rt", i));
  }
}

void SchedulerTest::RealtimeArrivesAndRuns(const std::string& id) {
  Submit("rt", kModelB, id);
  EXPECT_EQ(RequestIds(CompleteOldest()), (std::vector<std::string>{id}));
}

bool SchedulerTest::NothingDispatched(int in_flight) {
  return scheduler_->PollForTest(clock_.Now()) == 0 &&
         scheduler_->batches_in_flight() == in_flight &&
         enclave_.WaitForPending(static_cast<size_t>(in_flight)) &&
         enclave_.Pending().size() == static_cast<size_t>(in_flight);
}

void SchedulerTest::TearDown() {
  // Answer whatever is still pending so Stop() can finish.
  if (scheduler_) StopFailingPending(*scheduler_, enclave_);
}

}  // namespace cloister::host::scheduler_test
