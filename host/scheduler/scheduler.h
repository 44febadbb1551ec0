// Scheduler: cloisterd's admission control, queues, batch former and placement (DESIGN.md
// section 7).
//
// Admission (Submit): per tenant a token-bucket request rate, limits on queued requests and
// queued ciphertext bytes, a payload size limit and a deadline (the request's own, or the
// tenant's default). A refusal is RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED) with a message that
// names the tenant and the limit; nothing is dropped silently.
//
// Queues: one per (tenant, model handle, worker), so a batch always holds one tenant's requests
// for one model. A queue is ready when it holds `max_batch_size` requests (or the largest
// preferred batch size), or when its oldest request has waited `max_queue_delay`; a batch then
// takes the largest preferred size that fits, or everything up to `max_batch_size`.
//
// Order: tenants belong to a priority class (realtime, standard, batch). Classes are served in
// strict priority; within a class, weighted deficit round robin over tenants, charged in
// execution time: a batch is charged at dispatch with the model's estimated per-item cost (an
// EWMA of observed batches) and corrected by the measured time when the reply arrives. While
// realtime requests wait, a batch-class batch is capped in size and estimated duration.
//
// Placement: several enclave workers, each with up to `max_batches_in_flight` batches. A request
// bound to a worker (the one that holds its session) only runs there; an unbound one runs on the
// least busy worker.
//
// Every accepted request gets exactly one answer through its callback: the enclave's sealed reply
// item, or an error (the batch failed, the enclave refused this item, the deadline passed in the
// queue, the client cancelled, or the scheduler stopped).
//
// Threading: Submit() and Cancel() are thread-safe and never block on the enclave. When a
// Submit() makes a batch ready and a worker slot is free, it dispatches that batch itself (no
// hand-over to the batcher thread); otherwise the batcher thread dispatches. Callbacks run on an
// enclave client's completion thread, on the batcher thread (expired deadlines, shutdown) or on
// the caller's thread (an immediate refusal, a cancellation, answers that come back inside
// EnclaveClient::Call()); callers must not hold a lock that a callback takes, and callbacks must
// not block for long or call Stop().
// Ownership: the scheduler owns its thread; the EnclaveClients and the Clock must outlive it.
//
// The policies are plain classes beside it, each taking the time as a parameter: the rate
// limit (token_bucket.h), the realtime period learning and hold-back (arrival_predictor.h) and
// the learned per-model cost (cost_model.h); the options are in scheduler_options.h.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "host/enclave_client/enclave_client.h"
#include "host/scheduler/arrival_predictor.h"
#include "host/scheduler/cost_model.h"
#include "host/scheduler/scheduler_options.h"
#include "host/scheduler/token_bucket.h"

namespace cloister::host {

inline constexpr int kAnyWorker = -1;

// One inference request as the host sees it: sealed, with its routing metadata.
struct InferRequest {
  std::string tenant_id;
  boundary::v1::ForwardedRequest item;  // item.model_handle selects the queue
  // InfiniteFuture: the tenant's default deadline applies.
  absl::Time deadline = absl::InfiniteFuture();
  // The worker that must run it (its session lives there), or kAnyWorker.
  int worker = kAnyWorker;
};

// Counters for one tenant since the scheduler started.
struct TenantStats {
  uint64_t admitted = 0;
  uint64_t refused = 0;     // every admission refusal (rate, queue, size, deadline, shutdown)
  uint64_t expired = 0;     // deadline passed in the queue
  uint64_t cancelled = 0;   // removed from the queue by Cancel()
  uint64_t dispatched = 0;  // requests sent to a worker
  uint64_t batches = 0;
  // Execution time charged: estimates for batches in flight, measurements for finished ones.
  absl::Duration charged_time;
};

class Scheduler {
 public:
  // OK: the enclave's sealed reply for this request. Error: why there is none.
  using Done = std::function<void(absl::StatusOr<boundary::v1::EnclaveReply>)>;
  // Names a queued request for Cancel(); 0 names none.
  using Ticket = uint64_t;

  // InvalidArgument for options out of range or no workers. Starts the batcher thread.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(std::vector<EnclaveClient*> workers,
                                                           SchedulerOptions options);
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(EnclaveClient* worker,
                                                           SchedulerOptions options);
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Admits and queues one request; `done` runs exactly once. A refusal (see the file comment;
  // UNAVAILABLE after Stop(), INVALID_ARGUMENT for a worker index out of range) is answered at
  // once on the caller's thread and returns 0; otherwise the ticket for Cancel().
  Ticket Submit(InferRequest request, Done done);

  // Removes a request that is still queued and answers it CANCELLED on the caller's thread
  // (true). False if it was already dispatched or answered: its one answer comes from there.
  bool Cancel(Ticket ticket);

  // Answers every queued request with UNAVAILABLE "cloisterd is shutting down", waits until the
  // batches in flight are answered, and joins the thread. The enclave clients must complete
  // their calls for this to return (stopping them does). Idempotent.
  void Stop();

  // Requests queued and not yet dispatched, over all tenants.
  int queued_count() const;
  // Batches with the workers, over all workers.
  int batches_in_flight() const;
  int worker_count() const { return static_cast<int>(workers_.size()); }
  TenantStats StatsFor(absl::string_view tenant_id) const;
  // Requests queued per tenant that has ever submitted (0 for idle ones), with its stats.
  struct TenantQueueState {
    std::string tenant_id;
    int queued_count = 0;
    TenantStats stats;
  };
  std::vector<TenantQueueState> TenantQueues() const;
  // Batches in flight on each worker, in worker order.
  std::vector<int> InFlightPerWorker() const;
  // The current per-request cost estimate of a model (initial_item_cost before any batch).
  absl::Duration ItemCostEstimate(absl::string_view model_handle) const;
  // The limits that apply to `tenant_id`.
  const TenantLimits& LimitsFor(absl::string_view tenant_id) const;

  // Makes the batcher re-read the clock now (tests that advance a FakeClock).
  void WakeForTest();
  // Does on the caller's thread what the batcher does when it wakes at `now` (normally the
  // clock's reading): answers the queued requests past their deadline and dispatches every batch
  // that is ready for a free slot. Returns how many batches it dispatched, so that a test can
  // prove nothing was ready without giving the batcher thread real time. 0 after Stop().
  int PollForTest(absl::Time now);

 private:
  struct Queued {
    Ticket ticket;
    boundary::v1::ForwardedRequest item;
    absl::Time enqueued;
    absl::Time deadline;
    Done done;
  };
  struct Tenant;
  // Requests of one tenant for one model on one worker (or kAnyWorker). Listed in its tenant's
  // `active` exactly while non-empty.
  struct Queue {
    Tenant* tenant;
    std::string model_handle;
    int worker;
    std::deque<Queued> requests;
  };
  // Invariants: `queued_count` and `queued_size` sum the tenant's queued requests; the tenant is
  // in its class ring exactly while queued_count > 0; `active` lists its non-empty queues.
  struct Tenant {
    std::string id;
    const TenantLimits* limits;
    TokenBucket bucket{/*rate_per_second=*/0, /*burst=*/0, absl::InfinitePast()};
    int queued_count = 0;
    uint64_t queued_size = 0;
    int64_t deficit_ns = 0;
    absl::flat_hash_map<std::string, std::unique_ptr<Queue>> queues;  // by QueueName
    std::vector<Queue*> active;
    size_t next_active = 0;
    TenantStats stats;
    // Realtime tenants: when their requests come, to predict the next one.
    ArrivalPredictor predictor;
    // Every tenant: the smoothed share of its arrivals that came within max_queue_delay of the
    // one before (adaptive_queue_delay), and how many it has had, up to kCompanionWarmup.
    absl::Time last_admitted = absl::InfinitePast();
    double close_share = 0;
    int admitted_seen = 0;
  };
  struct Ring {
    std::vector<Tenant*> tenants;
    size_t cursor = 0;
  };
  // One batch taken from a queue, ready to send.
  struct Batch {
    int worker;
    Tenant* tenant;
    std::string model_handle;
    std::vector<Queued> requests;
    int64_t charged_ns;
    absl::Time dispatched;
  };
  // A callback with its outcome, run after the lock is released.
  using Answer = std::pair<Done, absl::StatusOr<boundary::v1::EnclaveReply>>;

  Scheduler(std::vector<EnclaveClient*> workers, SchedulerOptions options);
  static std::string QueueName(absl::string_view model_handle, int worker);

  Tenant& TenantLocked(absl::string_view tenant_id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admission checks; OK or the refusal. Takes a token from the bucket when OK.
  absl::Status AdmitLocked(Tenant& tenant, const InferRequest& request, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bookkeeping for a request leaving queue `queue` (dispatched, expired, cancelled, stopped).
  void ForgetLocked(Queue& queue, const Queued& queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `queue` from its tenant if it is empty, and the tenant from its ring if idle.
  void RetireIfEmptyLocked(Queue* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(absl::Time now, std::vector<Answer>& answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsReadyLocked(const Queue& queue, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tenant's next ready queue (from `next_active` on) that may run on `worker`, and its
  // index in `active`; nullptr if none.
  Queue* ReadyQueueLocked(const Tenant& tenant, int worker, absl::Time now, size_t& index) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes ready batches for free slots (least busy worker first) until none is left.
  void FillSlotsLocked(absl::Time now, std::vector<Batch>& batches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes any admitted request's arrival for adaptive_queue_delay.
  void RecordAdmittedLocked(Tenant& tenant, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When `queue` is ready by time alone: its oldest request's arrival plus max_queue_delay, or
  // that arrival itself when its tenant's requests rarely come in company.
  absl::Time FlushTimeLocked(const Queue& queue) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the next batch for `worker` by priority and deficit round robin (from the realtime
  // class alone when `realtime_only`); false if none.
  bool TakeBatchLocked(int worker, absl::Time now, bool realtime_only, Batch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a batch of `cost_ns` on `worker` must wait for a realtime request due soon (then
  // `holdback_until_` says until when).
  bool HoldBackLocked(int worker, absl::Time now, int64_t cost_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a realtime request is queued or arrived within realtime_activity_window.
  bool RealtimeActiveLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With no realtime request queued and every realtime tenant active within the activity window
  // periodic (a trusted period), the time until the first of them is due, less the arrival
  // guard and its jitter (0 when one is due or overdue); nothing when a realtime tenant's next
  // arrival cannot be predicted or the guard is off.
  std::optional<int64_t> RealtimeRoomLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The in-flight slots per worker that any class may fill: all of them, but while realtime
  // work is active, realtime_reserved_slots of them are realtime's.
  int SharedSlotsLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many requests the next batch from `queue` takes.
  int BatchCountLocked(const Queue& queue, int64_t item_cost_ns, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ItemCostLocked(absl::string_view model_handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the batcher must look again without being woken.
  absl::Time NextWakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers expired requests and takes ready batches for free slots at `now` (one batcher pass).
  void PassLocked(absl::Time now, std::vector<Answer>& answers, std::vector<Batch>& batches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers every queued request UNAVAILABLE (Stop()).
  void DropAllLocked(std::vector<Answer>& answers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `answers` and sends `batches`, without the lock held.
  void Deliver(std::vector<Answer>& answers, std::vector<Batch>& batches);
  void BatcherLoop();
  // Sends one batch to its worker (without the lock held).
  void Dispatch(Batch batch);
  // Charges the measured time of a finished batch and releases its slot.
  void Finished(int worker, const std::string& tenant_id, const std::string& model_handle,
                int count, int64_t charged_ns, int64_t measured_ns);
  // Answers every request of a batch from the enclave's reply.
  static void CompleteBatch(const std::vector<std::string>& request_ids, std::vector<Done>& dones,
                            EnclaveClient::Reply reply);

  const std::vector<EnclaveClient*> workers_;
  const SchedulerOptions options_;
  Clock* const clock_;
  const int largest_preferred_;  // 0 without preferred sizes

  mutable absl::Mutex mu_;
  absl::node_hash_map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  Ring rings_[kPriorityClassCount] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Ticket, Queue*> queued_by_ticket_ ABSL_GUARDED_BY(mu_);
  CostModel cost_model_ ABSL_GUARDED_BY(mu_);
  std::vector<int> in_flight_ ABSL_GUARDED_BY(mu_);  // per worker
  int total_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int queued_count_ ABSL_GUARDED_BY(mu_) = 0;
  int realtime_queued_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_realtime_arrival_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<Tenant*> realtime_tenants_ ABSL_GUARDED_BY(mu_);  // every realtime tenant seen
  absl::Time holdback_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  size_t next_worker_ ABSL_GUARDED_BY(mu_) = 0;  // where the least-busy search starts
  // The earliest finite deadline among queued requests (a lower bound; refreshed on expiry).
  absl::Time earliest_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t wake_generation_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread batcher_;
};

}  // namespace cloister::host
