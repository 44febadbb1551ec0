#include "host/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "proto/duration.h"
#include "proto/error_reason.h"

namespace cloister::host {

using boundary::v1::HostToEnclave;
using boundary::v1::EnclaveReply;

namespace {

int64_t Nanos(absl::Duration duration) { return absl::ToInt64Nanoseconds(duration); }

std::string FormatRate(double rate) {
  if (rate == std::floor(rate)) return absl::StrCat(static_cast<int64_t>(rate));
  return absl::StrCat(rate);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(std::vector<EnclaveClient*> workers,
                                                             SchedulerOptions options) {
  if (workers.empty()) return absl::InvalidArgumentError("scheduler needs an enclave client");
  for (EnclaveClient* worker : workers) {
    if (worker == nullptr) return absl::InvalidArgumentError("scheduler needs an enclave client");
  }
  RETURN_IF_ERROR(CheckSchedulerOptions(options));
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(workers), std::move(options)));
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(EnclaveClient* worker,
                                                             SchedulerOptions options) {
  return Create(std::vector<EnclaveClient*>{worker}, std::move(options));
}

Scheduler::Scheduler(std::vector<EnclaveClient*> workers, SchedulerOptions options)
    : workers_(std::move(workers)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      largest_preferred_(
          options_.preferred_batch_sizes.empty() ? 0 : options_.preferred_batch_sizes.back()),
      cost_model_(options_.initial_item_cost, options_.cost_smoothing),
      in_flight_(workers_.size(), 0) {
  batcher_ = std::thread([this] { BatcherLoop(); });
}

Scheduler::~Scheduler() { Stop(); }

std::string Scheduler::QueueName(absl::string_view model_handle, int worker) {
  return absl::StrCat(model_handle, "@", worker);
}

const TenantLimits& Scheduler::LimitsFor(absl::string_view tenant_id) const {
  auto it = options_.tenant_limits.find(std::string(tenant_id));
  return it != options_.tenant_limits.end() ? it->second : options_.default_limits;
}

Scheduler::Tenant& Scheduler::TenantLocked(absl::string_view tenant_id, absl::Time now) {
  auto it = tenants_.find(tenant_id);
  if (it != tenants_.end()) return it->second;
  Tenant& tenant = tenants_[std::string(tenant_id)];
  tenant.id = std::string(tenant_id);
  tenant.limits = &LimitsFor(tenant_id);
  tenant.bucket = TokenBucket(tenant.limits->rate_per_second, tenant.limits->burst, now);
  return tenant;
}

absl::Status Scheduler::AdmitLocked(Tenant& tenant, const InferRequest& request, absl::Time now) {
  const TenantLimits& limits = *tenant.limits;
  if (stopping_) return absl::UnavailableError("cloisterd is shutting down");
  if (request.worker != kAnyWorker &&
      (request.worker < 0 || request.worker >= static_cast<int>(workers_.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("no enclave worker ", request.worker));
  }
  uint64_t size = request.item.ciphertext().size();
  if (size > limits.max_payload_size) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant.id, ": payload of ", size,
                                                  " bytes exceeds the limit of ",
                                                  limits.max_payload_size, " bytes")),
        api::v1::TOO_LARGE);
  }
  if (tenant.queued_count >= limits.max_queued_requests) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant.id, ": queue limit of ",
                                                  limits.max_queued_requests,
                                                  " requests reached; retry later")),
        api::v1::OVERLOADED);
  }
  if (tenant.queued_size + size > limits.max_queued_size) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant.id, ": queued-bytes limit of ",
                                                  limits.max_queued_size,
                                                  " bytes reached; retry later")),
        api::v1::OVERLOADED);
  }
  if (!tenant.bucket.TryTake(now)) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "tenant ", tenant.id, ": rate limit ", FormatRate(limits.rate_per_second),
            " requests/s exceeded (burst ", FormatRate(tenant.bucket.burst()), "); retry later")),
        api::v1::OVERLOADED);
  }
  return absl::OkStatus();
}

Scheduler::Ticket Scheduler::Submit(InferRequest request, Done done) {
  absl::Status refusal;
  Ticket ticket = 0;
  std::vector<Answer> answers;
  std::vector<Batch> batches;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    Tenant& tenant = TenantLocked(request.tenant_id, now);
    absl::Time deadline = request.deadline;
    if (deadline == absl::InfiniteFuture() &&
        tenant.limits->default_deadline != absl::InfiniteDuration()) {
      deadline = now + tenant.limits->default_deadline;
    }
    if (tenant.limits->max_deadline != absl::InfiniteDuration()) {
      deadline = std::min(deadline, now + tenant.limits->max_deadline);
    }
    if (deadline <= now) {
      refusal = absl::DeadlineExceededError(
          absl::StrCat("tenant ", tenant.id, ": request deadline passed before it was queued"));
    } else {
      refusal = AdmitLocked(tenant, request, now);
    }
    if (!refusal.ok()) {
      ++tenant.stats.refused;
    } else {
      std::string name = QueueName(request.item.model_handle(), request.worker);
      std::unique_ptr<Queue>& slot = tenant.queues[name];
      if (slot == nullptr) {
        slot = std::make_unique<Queue>();
        slot->tenant = &tenant;
        slot->model_handle = request.item.model_handle();
        slot->worker = request.worker;
      }
      Queue& queue = *slot;
      bool wake = false;
      if (queue.requests.empty()) {
        tenant.active.push_back(&queue);
        wake = true;  // a new queue: the batcher must learn its flush time
      }
      if (tenant.queued_count == 0) {
        rings_[static_cast<int>(tenant.limits->priority)].tenants.push_back(&tenant);
      }
      ticket = next_ticket_++;
      ++tenant.queued_count;
      tenant.queued_size += request.item.ciphertext().size();
      ++tenant.stats.admitted;
      ++queued_count_;
      RecordAdmittedLocked(tenant, now);
      if (tenant.limits->priority == PriorityClass::kRealtime) {
        ++realtime_queued_;
        last_realtime_arrival_ = now;
        if (tenant.predictor.arrival_count() == 0) realtime_tenants_.push_back(&tenant);
        tenant.predictor.Arrived(now);
      }
      if (deadline < earliest_deadline_) {
        earliest_deadline_ = deadline;
        wake = true;
      }
      queue.requests.push_back(
          Queued{ticket, std::move(request.item), now, deadline, std::move(done)});
      queued_by_ticket_[ticket] = &queue;
      int count = static_cast<int>(queue.requests.size());
      if (count == options_.max_batch_size || count == largest_preferred_) wake = true;
      if (IsReadyLocked(queue, now) &&
          total_in_flight_ < options_.max_batches_in_flight * static_cast<int>(workers_.size())) {
        // Fast path: a slot is free and this request made a batch ready, so dispatch from here
        // instead of handing over to the batcher thread (TakeBatchLocked still picks which
        // batch goes, by priority and fairness). `queue` may be gone afterwards.
        PassLocked(now, answers, batches);
      }
      // The batcher must learn of a new queue's flush time or an earlier deadline, unless this
      // request already left with a batch (then there is nothing new to wait for).
      if (wake && queued_by_ticket_.contains(ticket)) ++wake_generation_;
    }
  }
  if (!refusal.ok()) {
    done(std::move(refusal));
    return 0;
  }
  Deliver(answers, batches);
  return ticket;
}

bool Scheduler::Cancel(Ticket ticket) {
  Done done;
  {
    absl::MutexLock lock(&mu_);
    auto it = queued_by_ticket_.find(ticket);
    if (it == queued_by_ticket_.end()) return false;
    Queue* queue = it->second;
    auto position =
        std::find_if(queue->requests.begin(), queue->requests.end(),
                     [ticket](const Queued& queued) { return queued.ticket == ticket; });
    CLOISTER_CHECK(position != queue->requests.end());
    done = std::move(position->done);
    ++queue->tenant->stats.cancelled;
    ForgetLocked(*queue, *position);
    queue->requests.erase(position);
    RetireIfEmptyLocked(queue);
    ++wake_generation_;  // the queue's flush time may have changed
  }
  done(absl::CancelledError("request cancelled by the client while queued"));
  return true;
}

void Scheduler::ForgetLocked(Queue& queue, const Queued& queued) {
  Tenant& tenant = *queue.tenant;
  queued_by_ticket_.erase(queued.ticket);
  --tenant.queued_count;
  tenant.queued_size -= queued.item.ciphertext().size();
  --queued_count_;
  if (tenant.limits->priority == PriorityClass::kRealtime) --realtime_queued_;
}

void Scheduler::RetireIfEmptyLocked(Queue* queue) {
  if (!queue->requests.empty()) return;
  Tenant& tenant = *queue->tenant;
  auto position = std::find(tenant.active.begin(), tenant.active.end(), queue);
  CLOISTER_CHECK(position != tenant.active.end());
  size_t index = position - tenant.active.begin();
  tenant.active.erase(position);
  if (tenant.next_active > index) --tenant.next_active;
  if (tenant.next_active >= tenant.active.size()) tenant.next_active = 0;
  tenant.queues.erase(QueueName(queue->model_handle, queue->worker));  // deletes *queue
  if (tenant.queued_count > 0) return;
  // Queues that emptied together (ExpireLocked) are retired one after the other: the tenant
  // leaves its ring with the last of them.
  for (const Queue* other : tenant.active) CLOISTER_CHECK(other->requests.empty());
  if (!tenant.active.empty()) return;
  // An idle tenant keeps its debts but not its credit (deficit round robin).
  tenant.deficit_ns = std::min<int64_t>(tenant.deficit_ns, 0);
  Ring& ring = rings_[static_cast<int>(tenant.limits->priority)];
  auto in_ring = std::find(ring.tenants.begin(), ring.tenants.end(), &tenant);
  CLOISTER_CHECK(in_ring != ring.tenants.end());
  size_t ring_index = in_ring - ring.tenants.begin();
  ring.tenants.erase(in_ring);
  if (ring.cursor > ring_index) --ring.cursor;
  if (ring.cursor >= ring.tenants.size()) ring.cursor = 0;
}

void Scheduler::ExpireLocked(absl::Time now, std::vector<Answer>& answers) {
  if (now < earliest_deadline_) return;
  earliest_deadline_ = absl::InfiniteFuture();
  std::vector<Queue*> emptied;
  for (Ring& ring : rings_) {
    for (Tenant* tenant : ring.tenants) {
      for (Queue* queue : tenant->active) {
        std::deque<Queued> kept;
        for (Queued& queued : queue->requests) {
          if (queued.deadline <= now) {
            answers.emplace_back(
                std::move(queued.done),
                absl::DeadlineExceededError(absl::StrCat(
                    "tenant ", tenant->id, ": request waited in the queue past its deadline (",
                    absl::FormatDuration(now - queued.enqueued), ")")));
            ++tenant->stats.expired;
            ForgetLocked(*queue, queued);
          } else {
            earliest_deadline_ = std::min(earliest_deadline_, queued.deadline);
            kept.push_back(std::move(queued));
          }
        }
        queue->requests.swap(kept);
        if (queue->requests.empty()) emptied.push_back(queue);
      }
    }
  }
  for (Queue* queue : emptied) RetireIfEmptyLocked(queue);
}

void Scheduler::PassLocked(absl::Time now, std::vector<Answer>& answers,
                           std::vector<Batch>& batches) {
  ExpireLocked(now, answers);
  FillSlotsLocked(now, batches);
}

void Scheduler::DropAllLocked(std::vector<Answer>& answers) {
  for (Ring& ring : rings_) {
    for (Tenant* tenant : ring.tenants) {
      for (Queue* queue : tenant->active) {
        for (Queued& queued : queue->requests) {
          answers.emplace_back(std::move(queued.done),
                               absl::UnavailableError("cloisterd is shutting down"));
        }
      }
      tenant->active.clear();
      tenant->queues.clear();
      tenant->queued_count = 0;
      tenant->queued_size = 0;
    }
    ring.tenants.clear();
    ring.cursor = 0;
  }
  queued_by_ticket_.clear();
  queued_count_ = 0;
  realtime_queued_ = 0;
}

void Scheduler::Deliver(std::vector<Answer>& answers, std::vector<Batch>& batches) {
  for (auto& [done, outcome] : answers) done(std::move(outcome));
  for (Batch& batch : batches) Dispatch(std::move(batch));
}

void Scheduler::BatcherLoop() {
  std::vector<Answer> answers;
  std::vector<Batch> batches;
  while (true) {
    answers.clear();
    batches.clear();
    bool stopping = false;
    mu_.Lock();
    absl::Time now = clock_->Now();
    if (stopping_) {
      stopping = true;
      DropAllLocked(answers);
    } else {
      PassLocked(now, answers, batches);
      if (batches.empty() && answers.empty()) {
        uint64_t generation = wake_generation_;
        auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || wake_generation_ != generation;
        };
        absl::Time wake = NextWakeLocked();
        if (wake == absl::InfiniteFuture()) {
          mu_.Await(absl::Condition(&changed));
        } else {
          mu_.AwaitWithTimeout(absl::Condition(&changed),
                               std::max(wake - now, absl::Microseconds(50)));
        }
        mu_.Unlock();
        continue;
      }
    }
    mu_.Unlock();

    Deliver(answers, batches);
    if (stopping) {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return total_in_flight_ == 0; };
      mu_.Await(absl::Condition(&idle));
      return;
    }
  }
}

void Scheduler::Dispatch(Batch batch) {
  HostToEnclave call;
  boundary::v1::InferBatchCall* infer = call.mutable_infer_batch();
  infer->set_tenant_id(batch.tenant->id);  // tenants are never erased: the pointer stays valid
  infer->set_model_handle(batch.model_handle);
  auto request_ids = std::make_shared<std::vector<std::string>>();
  auto dones = std::make_shared<std::vector<Done>>();
  request_ids->reserve(batch.requests.size());
  dones->reserve(batch.requests.size());
  const absl::Time now = clock_->Now();
  for (Queued& queued : batch.requests) {
    request_ids->push_back(queued.item.request_id());
    dones->push_back(std::move(queued.done));
    // The deadline travels as the time left (the enclave's clock is its own), so that the
    // enclave stops a run that outlives it.
    if (queued.deadline != absl::InfiniteFuture()) {
      *queued.item.mutable_time_left() = proto::ToProtoDuration(queued.deadline - now);
    }
    *infer->add_items() = std::move(queued.item);
  }
  int count = static_cast<int>(request_ids->size());
  std::shared_ptr<BatchObservation> observation;
  if (options_.on_batch_done) {
    observation = std::make_shared<BatchObservation>();
    observation->worker = batch.worker;
    observation->tenant_id = batch.tenant->id;
    observation->priority = batch.tenant->limits->priority;
    observation->count = count;
    observation->queue_waits.reserve(batch.requests.size());
    for (const Queued& queued : batch.requests) {
      observation->queue_waits.push_back(batch.dispatched - queued.enqueued);
    }
  }
  workers_[batch.worker]->Call(
      std::move(call),
      [this, request_ids, dones, worker = batch.worker, tenant_id = batch.tenant->id,
       model_handle = std::move(batch.model_handle), count, charged_ns = batch.charged_ns,
       dispatched = batch.dispatched, observation](EnclaveClient::Reply reply) {
        int64_t measured_ns = 0;
        if (reply.ok() && reply->has_infer_batch())
          measured_ns = reply->infer_batch().execution_ns();
        if (measured_ns <= 0) measured_ns = Nanos(clock_->Now() - dispatched);
        if (options_.on_batch_reply) options_.on_batch_reply(worker, reply);
        // Answer first, then release the slot: once Stop() sees no batch in flight, every
        // answer has been delivered.
        bool batch_ok = reply.ok();
        CompleteBatch(*request_ids, *dones, std::move(reply));
        if (observation) {
          observation->execution = clock_->Now() - dispatched;
          observation->ok = batch_ok;
          options_.on_batch_done(*observation);
        }
        Finished(worker, tenant_id, model_handle, count, charged_ns, measured_ns);
      });
}

void Scheduler::Finished(int worker, const std::string& tenant_id, const std::string& model_handle,
                         int count, int64_t charged_ns, int64_t measured_ns) {
  absl::MutexLock lock(&mu_);
  measured_ns = Nanos(cost_model_.Learn(model_handle, count, absl::Nanoseconds(measured_ns)));
  Tenant& tenant = tenants_.find(tenant_id)->second;
  tenant.deficit_ns -= measured_ns - charged_ns;
  tenant.stats.charged_time += absl::Nanoseconds(measured_ns - charged_ns);
  --in_flight_[worker];
  --total_in_flight_;
  // A free slot matters to the batcher only if something waits for it (or Stop() does).
  if (queued_count_ > 0 || stopping_) ++wake_generation_;
}

void Scheduler::CompleteBatch(const std::vector<std::string>& request_ids, std::vector<Done>& dones,
                              EnclaveClient::Reply reply) {
  CLOISTER_CHECK(request_ids.size() == dones.size());
  absl::Status batch_error;
  if (!reply.ok()) {
    batch_error = reply.status();
  } else if (reply->infer_batch().replies_size() != static_cast<int>(dones.size())) {
    batch_error = absl::InternalError(
        absl::StrCat("enclave answered a batch of ", dones.size(), " requests with ",
                     reply->infer_batch().replies_size(), " replies"));
  }
  if (!batch_error.ok()) {
    Log(LogLevel::kWarning, "batch_failed",
        {{"count", static_cast<long long>(dones.size())}, {"error", batch_error.ToString()}});
    for (Done& done : dones) done(batch_error);
    return;
  }
  auto* replies = reply->mutable_infer_batch()->mutable_replies();
  for (size_t i = 0; i < dones.size(); ++i) {
    EnclaveReply& item = (*replies)[static_cast<int>(i)];
    if (item.request_id() != request_ids[i]) {
      dones[i](absl::InternalError("enclave reply does not match the request order of the batch"));
    } else if (item.has_status() && item.status().code() != 0) {
      dones[i](FromBoundaryStatus(item.status()));
    } else {
      dones[i](std::move(item));
    }
  }
}

void Scheduler::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  batcher_.join();
}

int Scheduler::queued_count() const {
  absl::MutexLock lock(&mu_);
  return queued_count_;
}

int Scheduler::batches_in_flight() const {
  absl::MutexLock lock(&mu_);
  return total_in_flight_;
}

TenantStats Scheduler::StatsFor(absl::string_view tenant_id) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant_id);
  return it == tenants_.end() ? TenantStats() : it->second.stats;
}

std::vector<Scheduler::TenantQueueState> Scheduler::TenantQueues() const {
  absl::MutexLock lock(&mu_);
  std::vector<TenantQueueState> states;
  states.reserve(tenants_.size());
  for (const auto& [id, tenant] : tenants_) {
    states.push_back({id, tenant.queued_count, tenant.stats});
  }
  std::sort(states.begin(), states.end(), [](const TenantQueueState& a, const TenantQueueState& b) {
    return a.tenant_id < b.tenant_id;
  });
  return states;
}

std::vector<int> Scheduler::InFlightPerWorker() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

absl::Duration Scheduler::ItemCostEstimate(absl::string_view model_handle) const {
  absl::MutexLock lock(&mu_);
  return absl::Nanoseconds(ItemCostLocked(model_handle));
}

void Scheduler::WakeForTest() {
  absl::MutexLock lock(&mu_);
  ++wake_generation_;
}

int Scheduler::PollForTest(absl::Time now) {
  std::vector<Answer> answers;
  std::vector<Batch> batches;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return 0;
    PassLocked(now, answers, batches);
    ++wake_generation_;  // the batcher's wake time may have changed with this pass
  }
  Deliver(answers, batches);
  return static_cast<int>(batches.size());
}

}  // namespace cloister::host
