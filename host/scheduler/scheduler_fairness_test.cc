// The Scheduler's shares and placement: execution time follows the weights (deficit round robin
// charged by the learned cost), and batches spread over workers while pinned requests stay.
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
  // Each batch's time was learnt before Complete() returned on this thread.
  EXPECT_EQ(scheduler_->batches_in_flight(), 0);
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

}  // namespace
}  // namespace cloister::host::scheduler_test
