// Scheduler: cloisterd's inference queues and batch former (DESIGN.md section 7). Requests are
// queued per (tenant, model handle); a batcher thread turns a queue into one InferBatchCall when
// it holds `max_batch_size` requests or its oldest request has waited `max_queue_delay`, so a
// batch always holds one tenant's requests for one model. Ready queues are served round robin,
// and at most `max_batches_in_flight` batches are with the enclave worker at once (two: one
// batch's transfer overlaps another's compute).
//
// Every accepted request gets exactly one answer through its callback: the enclave's sealed
// reply item, or an error (the batch failed, the enclave refused this item, the request waited
// past its deadline, the queue was full, or the scheduler stopped).
//
// Threading: Submit() is thread-safe and never blocks on the enclave. Callbacks run on the
// enclave client's completion thread, on the batcher thread (expired deadlines, shutdown) or,
// for an immediate refusal, on the caller's thread; they must not block for long.
// Ownership: the scheduler owns its thread; the EnclaveClient and Clock must outlive it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

struct SchedulerOptions {
  int max_batch_size = 8;                                  // 1..1024 requests
  absl::Duration max_queue_delay = absl::Milliseconds(2);  // 0..10 s
  int max_batches_in_flight = 2;                           // per enclave worker, >= 1
  // Admission: queued (not yet dispatched) requests per tenant; more is RESOURCE_EXHAUSTED.
  int max_queued_requests_per_tenant = 1024;
  Clock* clock = nullptr;  // nullptr: Clock::Real()
};

// One inference request as the host sees it: sealed, with its routing metadata.
struct InferRequest {
  std::string tenant_id;
  boundary::v1::SealedItem item;  // item.model_handle selects the queue
  absl::Time deadline = absl::InfiniteFuture();
};

class Scheduler {
 public:
  // OK: the enclave's sealed reply for this request. Error: why there is none.
  using Done = std::function<void(absl::StatusOr<boundary::v1::SealedReplyItem>)>;

  // InvalidArgument for options out of range. Starts the batcher thread.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(EnclaveClient* enclave,
                                                           SchedulerOptions options);
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues one request; `done` runs exactly once. RESOURCE_EXHAUSTED when the tenant's queue
  // limit is reached, UNAVAILABLE after Stop(), DEADLINE_EXCEEDED if the deadline has passed
  // (all three answered at once, on the caller's thread).
  void Submit(InferRequest request, Done done);

  // Answers every queued request with UNAVAILABLE "cloisterd is shutting down", waits until the
  // batches in flight are answered, and joins the thread. The enclave client must complete its
  // calls for this to return (stopping it does). Idempotent.
  void Stop();

  // Requests queued and not yet dispatched, over all tenants.
  int queued_count() const;
  int batches_in_flight() const;

  // Makes the batcher re-read the clock now (tests that advance a FakeClock).
  void WakeForTest();

 private:
  struct Queued {
    boundary::v1::SealedItem item;
    absl::Time enqueued;
    absl::Time deadline;
    Done done;
  };
  using QueueKey = std::pair<std::string, std::string>;  // (tenant, model handle)
  // Invariant: a Queue in queues_ is never empty and is listed exactly once in order_, at
  // `position`; empty queues are erased from both.
  struct Queue {
    std::deque<Queued> requests;
    std::list<QueueKey>::iterator position;
  };
  // A callback with its outcome, run after the lock is released.
  using Answer = std::pair<Done, absl::StatusOr<boundary::v1::SealedReplyItem>>;

  Scheduler(EnclaveClient* enclave, SchedulerOptions options);
  void BatcherLoop();
  // Removes requests whose deadline has passed; their answers go to `answers`.
  void ExpireLocked(absl::Time now, std::vector<Answer>& answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next queue (round robin) that is full or has waited long enough, or order_.end().
  std::list<QueueKey>::iterator FindReadyLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the batcher must look again without being woken: the earliest queue delay or deadline.
  absl::Time NextWakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one batch to the enclave (without the lock held).
  void Dispatch(const QueueKey& key, std::deque<Queued> batch);
  // Answers every request of a batch from the enclave's reply.
  static void CompleteBatch(const std::vector<std::string>& request_ids, std::vector<Done>& dones,
                            EnclaveClient::Reply reply);

  EnclaveClient* const enclave_;
  const SchedulerOptions options_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  std::map<QueueKey, Queue> queues_ ABSL_GUARDED_BY(mu_);
  std::list<QueueKey> order_ ABSL_GUARDED_BY(mu_);  // non-empty queues, round-robin order
  absl::flat_hash_map<std::string, int> queued_per_tenant_ ABSL_GUARDED_BY(mu_);
  int queued_count_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // The earliest finite deadline among queued requests (a lower bound; refreshed on expiry).
  absl::Time earliest_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t wake_generation_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread batcher_;
};

}  // namespace cloister::host
