// The Scheduler under random operations (fixed seeds, fake clock) and under concurrent load:
// every request gets exactly one answer and no internal check trips.
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
    // Drain: time passes and the worker answers until every request has its answer. Every
    // completion runs on this thread, so once the batches counted in flight have reached the
    // enclave nothing else is under way.
    auto answered = [&] { return answers_.total() - answered_before; };
    for (int round = 0; round < 10000 && answered() < static_cast<int>(ids.size()); ++round) {
      for (const HostToEnclave& call : enclave_.Pending()) {
        enclave_.Complete(call.call_id(), ReplyTo(call));
      }
      clock_.Advance(absl::Milliseconds(5));
      scheduler_->PollForTest(clock_.Now());
      ASSERT_TRUE(enclave_.WaitForPending(scheduler_->batches_in_flight()));
    }
    ASSERT_EQ(answered(), static_cast<int>(ids.size()));
    for (const std::string& id : ids) ASSERT_EQ(answers_.Of(id).size(), 1u) << id;
    EXPECT_EQ(scheduler_->queued_count(), 0);
    // Every request is answered, so no call is pending: Stop() has nothing to wait for, and the
    // enclave serves the next seed.
    ASSERT_TRUE(enclave_.Pending().empty());
    scheduler_->Stop();
    scheduler_.reset();
  }
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
    // Drain, as in the single-worker test above.
    for (int round = 0; round < 10000 && answers.total() < submitted; ++round) {
      for (FakeEnclaveClient& worker : workers) {
        for (const HostToEnclave& call : worker.Pending()) {
          worker.Complete(call.call_id(), ReplyTo(call));
        }
      }
      clock.Advance(absl::Milliseconds(5));
      (*scheduler)->PollForTest(clock.Now());
      const std::vector<int> in_flight = (*scheduler)->InFlightPerWorker();
      for (int i = 0; i < 2; ++i) ASSERT_TRUE(workers[i].WaitForPending(in_flight[i]));
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
  // Time passes beyond every queue delay and deadline, and the workers drain the queues (each
  // finished batch wakes the batcher for the next one); then stop.
  clock.Advance(absl::Seconds(1));
  (*scheduler)->WakeForTest();
  ASSERT_TRUE(answers.WaitForTotal(kThreads * kPerThread, absl::Seconds(60)));
  (*scheduler)->Stop();
  // Once Stop() has returned no callback is left to run: a second answer would be counted now.
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
}  // namespace cloister::host::scheduler_test
