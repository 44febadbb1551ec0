// Helpers for the Scheduler's tests: an answer collector, enclave replies, and the SchedulerTest
// fixture (one manual FakeEnclaveClient worker and a FakeClock). Test-only; nothing here
// sleeps: tests that must show that nothing was dispatched poll the scheduler synchronously
// (Scheduler::PollForTest).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "gtest/gtest.h"
#include "host/scheduler/scheduler.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host::scheduler_test {

// The messages and the fake the scheduler tests all use.
using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::EnclaveReply;
using testing::FakeEnclaveClient;

inline constexpr char kModelA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
inline constexpr char kModelB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

// Collects every answer the scheduler gives, by request id. Thread-safe.
class Answers {
 public:
  Scheduler::Done For(const std::string& request_id);
  // Waits until at least `count` answers came; false on timeout.
  bool WaitForTotal(int count, absl::Duration timeout = absl::Seconds(10));
  int total();
  std::vector<absl::StatusOr<boundary::v1::EnclaveReply>> Of(const std::string& request_id);
  std::map<std::string, std::vector<absl::StatusOr<boundary::v1::EnclaveReply>>> All();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::vector<absl::StatusOr<boundary::v1::EnclaveReply>>> answers_
      ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

// A successful enclave reply to a batch call: "r:" + each item's ciphertext, 1 ms per request
// (the scheduler's initial estimate, so charges need no correction).
boundary::v1::EnclaveToHost ReplyTo(const boundary::v1::HostToEnclave& call);

std::vector<std::string> RequestIds(const boundary::v1::HostToEnclave& call);

// Stops `scheduler` while every call that `enclave` holds, and every later one, fails (the
// batcher may still dispatch while it stops: a completion frees a slot and requests are
// queued). `enclave` refuses every call from then on.
void StopFailingPending(Scheduler& scheduler, testing::FakeEnclaveClient& enclave);

class SchedulerTest : public ::testing::Test {
 protected:
  void Start(int max_batch_size, absl::Duration max_queue_delay, int max_in_flight = 2,
             int max_queued_per_tenant = 1024);

  Scheduler::Ticket Submit(const std::string& tenant, const std::string& model,
                           const std::string& request_id,
                           absl::Time deadline = absl::InfiniteFuture(), size_t size = 0);

  // Moves the fake clock and wakes the batcher.
  void Advance(absl::Duration duration);

  // Completes the oldest pending batch successfully and returns it.
  boundary::v1::HostToEnclave CompleteOldest();

  // A realtime tenant "rt" and a best-effort tenant "be" on one worker that runs one batch at a
  // time, with a 1 ms arrival guard; "rt" sends every 20 ms from 0 to 220 ms (each request runs
  // at once), so by 220 ms its period is trusted.
  void StartWithAPeriodicRealtimeTenant();
  // Submits a request of "rt" and checks that it is the next batch; completes it.
  void RealtimeArrivesAndRuns(const std::string& id);

  // Whether a batcher pass at the fake clock's time dispatches nothing and `in_flight` batches
  // (taken by the batcher thread or before) are with the enclave. Batches are counted in flight
  // when they are taken, under the scheduler's lock, so a batch that the batcher thread took
  // and has not yet sent counts too.
  bool NothingDispatched(int in_flight = 0);

  void TearDown() override;

  // Options the next Start() begins from.
  SchedulerOptions options_;
  FakeClock clock_;
  testing::FakeEnclaveClient enclave_;
  Answers answers_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace cloister::host::scheduler_test
