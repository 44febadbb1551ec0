#include "host/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/status.h"

namespace cloister::host {

using boundary::v1::HostToEnclave;
using boundary::v1::SealedReplyItem;

namespace {

constexpr int64_t kMinItemCostNs = 1000;  // so a batch always costs something
// A realtime tenant whose gaps are this many breaks in a row has a new pace.
constexpr int kBreaksToRelearn = 3;

int64_t Nanos(absl::Duration duration) { return absl::ToInt64Nanoseconds(duration); }

std::string FormatRate(double rate) {
  if (rate == std::floor(rate)) return absl::StrCat(static_cast<int64_t>(rate));
  return absl::StrCat(rate);
}

}  // namespace

absl::string_view PriorityClassName(PriorityClass priority) {
  switch (priority) {
    case PriorityClass::kRealtime:
      return "realtime";
    case PriorityClass::kStandard:
      return "standard";
    case PriorityClass::kBatch:
      return "batch";
  }
  return "unknown";
}

absl::StatusOr<PriorityClass> ParsePriorityClass(absl::string_view name) {
  if (name == "realtime") return PriorityClass::kRealtime;
  if (name == "standard") return PriorityClass::kStandard;
  if (name == "batch") return PriorityClass::kBatch;
  return absl::InvalidArgumentError(
      absl::StrCat("priority must be realtime, standard or batch, not '", name, "'"));
}

absl::Status CheckTenantLimits(const TenantLimits& limits) {
  if (limits.weight < 1 || limits.weight > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight must be in 1..10000, got ", limits.weight));
  }
  if (!(limits.rate_per_second >= 0) || limits.rate_per_second > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate_per_second must be in 0..1e9, got ", limits.rate_per_second));
  }
  if (!(limits.burst >= 0) || limits.burst > 1e9) {
    return absl::InvalidArgumentError(absl::StrCat("burst must be in 0..1e9, got ", limits.burst));
  }
  if (limits.max_queued_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_requests must be at least 1, got ", limits.max_queued_requests));
  }
  if (limits.max_queued_size < 1) {
    return absl::InvalidArgumentError("max_queued_bytes must be at least 1");
  }
  if (limits.max_payload_size < 1) {
    return absl::InvalidArgumentError("max_payload_bytes must be at least 1");
  }
  if (limits.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("default_deadline must be positive, got ",
                                                   absl::FormatDuration(limits.default_deadline)));
  }
  if (limits.max_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_deadline must be positive, got ",
                                                   absl::FormatDuration(limits.max_deadline)));
  }
  return absl::OkStatus();
}

absl::Status CheckSchedulerOptions(const SchedulerOptions& options) {
  if (options.max_batch_size < 1 || options.max_batch_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_size must be in 1..1024, got ", options.max_batch_size));
  }
  int previous = 0;
  for (int size : options.preferred_batch_sizes) {
    if (size <= previous || size > options.max_batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("preferred_batch_sizes must be ascending and each in 1..max_batch_size (",
                       options.max_batch_size, "), got [",
                       absl::StrJoin(options.preferred_batch_sizes, ", "), "]"));
    }
    previous = size;
  }
  if (options.max_queue_delay < absl::ZeroDuration() ||
      options.max_queue_delay > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue_delay must be in 0..10s, got ",
                                                   absl::FormatDuration(options.max_queue_delay)));
  }
  if (options.max_batches_in_flight < 1 || options.max_batches_in_flight > 64) {
    return absl::InvalidArgumentError(absl::StrCat("max_batches_in_flight must be in 1..64, got ",
                                                   options.max_batches_in_flight));
  }
  if (options.realtime_reserved_slots < 0 || options.realtime_reserved_slots > 64) {
    return absl::InvalidArgumentError(absl::StrCat("realtime_reserved_slots must be in 0..64, got ",
                                                   options.realtime_reserved_slots));
  }
  if (options.realtime_arrival_guard < absl::ZeroDuration() ||
      options.realtime_arrival_guard > absl::Seconds(1)) {
    return absl::InvalidArgumentError("realtime_arrival_guard must be in 0..1 s");
  }
  if (options.best_effort_max_batch_size < 1 || options.best_effort_max_batch_size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "best_effort_max_batch_size must be in 1..1024, got ", options.best_effort_max_batch_size));
  }
  if (options.realtime_activity_window < absl::ZeroDuration() ||
      options.realtime_activity_window > absl::Seconds(60)) {
    return absl::InvalidArgumentError("realtime_activity_window must be in 0..60 s");
  }
  if (options.best_effort_max_batch_time <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("best_effort_max_batch_time must be positive");
  }
  if (options.fairness_quantum <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("fairness_quantum must be positive");
  }
  if (options.initial_item_cost <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("initial_item_cost must be positive");
  }
  if (!(options.cost_smoothing > 0 && options.cost_smoothing <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost_smoothing must be in (0, 1], got ", options.cost_smoothing));
  }
  if (absl::Status status = CheckTenantLimits(options.default_limits); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("default limits: ", status.message()));
  }
  for (const auto& [tenant_id, limits] : options.tenant_limits) {
    if (absl::Status status = CheckTenantLimits(limits); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tenant ", tenant_id, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

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

Scheduler::Tenant& Scheduler::TenantLocked(absl::string_view tenant_id) {
  auto it = tenants_.find(tenant_id);
  if (it != tenants_.end()) return it->second;
  Tenant& tenant = tenants_[std::string(tenant_id)];
  tenant.id = std::string(tenant_id);
  tenant.limits = &LimitsFor(tenant_id);
  tenant.tokens = tenant.limits->burst > 0 ? tenant.limits->burst
                                           : std::max(1.0, tenant.limits->rate_per_second);
  tenant.refilled = clock_->Now();
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
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant.id, ": payload of ", size,
                                                     " bytes exceeds the limit of ",
                                                     limits.max_payload_size, " bytes"));
  }
  if (tenant.queued_count >= limits.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant.id, ": queue limit of ",
                                                     limits.max_queued_requests,
                                                     " requests reached; retry later"));
  }
  if (tenant.queued_size + size > limits.max_queued_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", tenant.id, ": queued-bytes limit of ", limits.max_queued_size,
                     " bytes reached; retry later"));
  }
  if (limits.rate_per_second > 0) {
    double burst = limits.burst > 0 ? limits.burst : std::max(1.0, limits.rate_per_second);
    double refill = absl::ToDoubleSeconds(now - tenant.refilled) * limits.rate_per_second;
    if (refill > 0) {
      tenant.tokens = std::min(burst, tenant.tokens + refill);
      tenant.refilled = now;
    }
    if (tenant.tokens < 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant ", tenant.id, ": rate limit ", FormatRate(limits.rate_per_second),
                       " requests/s exceeded (burst ", FormatRate(burst), "); retry later"));
    }
    tenant.tokens -= 1;
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
    Tenant& tenant = TenantLocked(request.tenant_id);
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
        RecordArrivalLocked(tenant, now);
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
        ExpireLocked(now, answers);
        FillSlotsLocked(now, batches);
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
  for (auto& [answer_done, outcome] : answers) answer_done(std::move(outcome));
  for (Batch& batch : batches) Dispatch(std::move(batch));
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

bool Scheduler::IsReadyLocked(const Queue& queue, absl::Time now) const {
  int count = static_cast<int>(queue.requests.size());
  return count >= options_.max_batch_size ||
         (largest_preferred_ > 0 && count >= largest_preferred_) || now >= FlushTimeLocked(queue);
}

namespace {
// Arrivals a tenant needs before adaptive_queue_delay trusts its share of close arrivals, and
// the weight of each new one in that share (about the last eight count).
constexpr int kCompanionWarmup = 4;
constexpr double kCompanionSmoothing = 0.125;
// Below this share of close arrivals a queue does not wait for company.
constexpr double kCompanionShare = 0.25;
}  // namespace

void Scheduler::RecordAdmittedLocked(Tenant& tenant, absl::Time now) {
  if (tenant.admitted_seen > 0) {
    const double close = now - tenant.last_admitted < options_.max_queue_delay ? 1.0 : 0.0;
    if (tenant.admitted_seen == 1) {
      tenant.close_share = close;  // the first gap seeds the share
    } else {
      tenant.close_share += (close - tenant.close_share) * kCompanionSmoothing;
    }
  }
  tenant.last_admitted = now;
  tenant.admitted_seen = std::min(tenant.admitted_seen + 1, kCompanionWarmup);
}

absl::Time Scheduler::FlushTimeLocked(const Queue& queue) const {
  const absl::Time oldest = queue.requests.front().enqueued;
  const Tenant& tenant = *queue.tenant;
  if (options_.adaptive_queue_delay && tenant.admitted_seen >= kCompanionWarmup &&
      tenant.close_share < kCompanionShare) {
    return oldest;
  }
  return oldest + options_.max_queue_delay;
}

Scheduler::Queue* Scheduler::ReadyQueueLocked(const Tenant& tenant, int worker, absl::Time now,
                                              size_t& index) const {
  size_t count = tenant.active.size();
  for (size_t i = 0; i < count; ++i) {
    index = (tenant.next_active + i) % count;
    Queue* queue = tenant.active[index];
    if (queue->worker != kAnyWorker && queue->worker != worker) continue;
    if (IsReadyLocked(*queue, now)) return queue;
  }
  return nullptr;
}

int64_t Scheduler::ItemCostLocked(absl::string_view model_handle) const {
  auto it = item_cost_ns_.find(model_handle);
  return it != item_cost_ns_.end() ? it->second : Nanos(options_.initial_item_cost);
}

int Scheduler::BatchCountLocked(const Queue& queue, int64_t item_cost_ns, absl::Time now) const {
  int available = static_cast<int>(queue.requests.size());
  int cap = options_.max_batch_size;
  if (queue.tenant->limits->priority == PriorityClass::kBatch && RealtimeActiveLocked(now)) {
    int64_t by_time =
        Nanos(options_.best_effort_max_batch_time) / std::max<int64_t>(item_cost_ns, 1);
    cap = std::min<int64_t>(
        {cap, options_.best_effort_max_batch_size, std::max<int64_t>(by_time, 1)});
    // Periodic realtime tenants leave gaps whose length is known: a batch that fits the gap
    // cannot be in a realtime request's way, so it may be as large as fits (small batches waste
    // the worker on per-batch costs and the gaps' ends on hold-backs).
    if (std::optional<int64_t> room = RealtimeRoomLocked(now); room.has_value()) {
      // Half the room: a misjudged cost or an early request then still finds the batch done.
      const int64_t fits = *room / 2 / std::max<int64_t>(item_cost_ns, 1);
      cap = std::max<int64_t>(cap, std::min<int64_t>(options_.max_batch_size, fits));
    }
  }
  if (available >= cap) return cap;
  // A partial batch: the largest preferred size that fits, else all there is.
  for (auto it = options_.preferred_batch_sizes.rbegin();
       it != options_.preferred_batch_sizes.rend(); ++it) {
    if (*it <= available) return *it;
  }
  return available;
}

namespace {

// A realtime tenant's period is trusted once four gaps agree within a quarter of it, and only
// up to 1 s.
bool PeriodTrusted(int arrivals, int64_t gap_ns, int64_t jitter_ns) {
  return arrivals >= 5 && gap_ns > 0 && gap_ns <= 1'000'000'000 && jitter_ns * 4 <= gap_ns;
}

}  // namespace

void Scheduler::RecordArrivalLocked(Tenant& tenant, absl::Time now) {
  if (tenant.arrivals == 0) realtime_tenants_.push_back(&tenant);
  if (tenant.arrivals > 0) {
    const int64_t gap = Nanos(now - tenant.last_arrival);
    // A gap of more than one and a half trusted periods is a break in the stream (frames
    // skipped, or a pause before it starts again), not a new period: learning it would take the
    // period's trust away for dozens of arrivals, and with it the hold-backs, just when the
    // stream resumes at its old pace. The period is kept and the schedule starts again from
    // this arrival. Three such gaps in a row are a new pace, learnt afresh.
    const bool broken = tenant.arrivals > 1 &&
                        PeriodTrusted(tenant.arrivals, tenant.gap_ns, tenant.jitter_ns) &&
                        gap > tenant.gap_ns + tenant.gap_ns / 2;
    tenant.breaks = broken ? tenant.breaks + 1 : 0;
    if (tenant.arrivals == 1 || tenant.breaks >= kBreaksToRelearn) {
      tenant.gap_ns = gap;
      tenant.jitter_ns = gap / 2;  // unproven until a few gaps agree
      tenant.breaks = 0;
      if (tenant.arrivals > 1) tenant.arrivals = 1;
    } else if (broken) {
      // Period and jitter stay as learnt.
    } else {
      tenant.jitter_ns += (std::abs(gap - tenant.gap_ns) - tenant.jitter_ns) / 4;
      tenant.gap_ns += (gap - tenant.gap_ns) / 4;
    }
  }
  const absl::Time expected = tenant.next_due;
  const absl::Duration gap = absl::Nanoseconds(tenant.gap_ns);
  const bool late = tenant.arrivals > 0 && expected != absl::InfinitePast() && now > expected &&
                    now - expected < gap / 2;
  tenant.late_ns -= tenant.late_ns / 256;
  if (late) tenant.late_ns = std::max(tenant.late_ns, Nanos(now - expected));
  tenant.next_due = late ? expected + gap : now + gap;
  tenant.last_arrival = now;
  tenant.arrivals = std::min(tenant.arrivals + 1, 1 << 20);
}

std::optional<int64_t> Scheduler::RealtimeRoomLocked(absl::Time now) const {
  if (options_.realtime_arrival_guard <= absl::ZeroDuration() || realtime_queued_ > 0) {
    return std::nullopt;
  }
  const int64_t guard = Nanos(options_.realtime_arrival_guard);
  std::optional<int64_t> room;
  for (const Tenant* tenant : realtime_tenants_) {
    if (now - tenant->last_arrival >= options_.realtime_activity_window) continue;  // gone quiet
    if (!PeriodTrusted(tenant->arrivals, tenant->gap_ns, tenant->jitter_ns)) return std::nullopt;
    const absl::Time due = tenant->next_due;
    const int64_t until = std::max<int64_t>(0, Nanos(due - now) - guard - tenant->jitter_ns);
    room = room.has_value() ? std::min(*room, until) : until;
  }
  return room;
}

bool Scheduler::HoldBackLocked(int worker, absl::Time now, int64_t cost_ns) {
  if (options_.realtime_arrival_guard <= absl::ZeroDuration() || realtime_tenants_.empty()) {
    return false;
  }
  // Never idle this worker while another one is idle: the realtime request can go there.
  for (int other = 0; other < static_cast<int>(in_flight_.size()); ++other) {
    if (other != worker && in_flight_[other] == 0) return false;
  }
  const int64_t guard = Nanos(options_.realtime_arrival_guard);
  absl::Time until = absl::InfinitePast();
  for (const Tenant* tenant : realtime_tenants_) {
    if (!PeriodTrusted(tenant->arrivals, tenant->gap_ns, tenant->jitter_ns)) continue;
    const absl::Time due = tenant->next_due;
    // A request later than the guard, its jitter and its recent lateness (at most a quarter
    // period) is not coming on schedule: stop waiting for it.
    const int64_t allowance =
        std::max(tenant->jitter_ns, std::min(tenant->late_ns, tenant->gap_ns / 4));
    const absl::Time latest = due + absl::Nanoseconds(guard + allowance);
    // Due before this batch would finish, and not yet overdue beyond the allowance.
    if (now + absl::Nanoseconds(cost_ns + guard) >= due && now < latest) {
      until = std::max(until, latest);
    }
  }
  if (until == absl::InfinitePast()) return false;
  holdback_until_ = std::max(holdback_until_, until);
  return true;
}

bool Scheduler::RealtimeActiveLocked(absl::Time now) const {
  return realtime_queued_ > 0 || now - last_realtime_arrival_ < options_.realtime_activity_window;
}

int Scheduler::SharedSlotsLocked(absl::Time now) const {
  if (!RealtimeActiveLocked(now)) return options_.max_batches_in_flight;
  return options_.max_batches_in_flight -
         std::min(options_.realtime_reserved_slots, options_.max_batches_in_flight - 1);
}

bool Scheduler::TakeBatchLocked(int worker, absl::Time now, bool realtime_only, Batch& batch) {
  for (Ring& ring : rings_) {
    if (ring.tenants.empty()) continue;
    if (realtime_only && &ring != &rings_[static_cast<int>(PriorityClass::kRealtime)]) continue;
    Tenant* chosen = nullptr;
    Queue* queue = nullptr;
    size_t chosen_index = 0;
    size_t queue_index = 0;
    for (int pass = 0; pass < 2 && chosen == nullptr; ++pass) {
      size_t count = ring.tenants.size();
      // The ready tenants of this round that have no credit left, and how many rounds of credit
      // the first of them needs.
      std::vector<Tenant*> waiting;
      int64_t rounds = INT64_MAX;
      for (size_t i = 0; i < count; ++i) {
        size_t index = (ring.cursor + i) % count;
        Tenant* tenant = ring.tenants[index];
        size_t ready_index = 0;
        Queue* ready = ReadyQueueLocked(*tenant, worker, now, ready_index);
        if (ready == nullptr) continue;
        if (tenant->deficit_ns > 0) {
          chosen = tenant;
          queue = ready;
          chosen_index = index;
          queue_index = ready_index;
          break;
        }
        int64_t credit = Nanos(options_.fairness_quantum) * tenant->limits->weight;
        rounds = std::min(rounds, (1 - tenant->deficit_ns + credit - 1) / credit);
        waiting.push_back(tenant);
      }
      if (chosen != nullptr || waiting.empty()) break;
      // Nobody ready has credit: run as many DRR rounds at once as the first needs.
      for (Tenant* tenant : waiting) {
        tenant->deficit_ns += rounds * Nanos(options_.fairness_quantum) * tenant->limits->weight;
      }
    }
    if (chosen == nullptr) continue;

    int64_t item_cost = ItemCostLocked(queue->model_handle);
    int count = BatchCountLocked(*queue, item_cost, now);
    CLOISTER_CHECK(count >= 1 && count <= static_cast<int>(queue->requests.size()));
    // Lower classes make way for a periodic realtime request that is about to arrive.
    if (&ring != &rings_[static_cast<int>(PriorityClass::kRealtime)] &&
        HoldBackLocked(worker, now, item_cost * count)) {
      return false;
    }
    batch.worker = worker;
    batch.tenant = chosen;
    batch.model_handle = queue->model_handle;
    batch.requests.clear();
    batch.requests.reserve(count);
    for (int i = 0; i < count; ++i) {
      Queued& queued = queue->requests.front();
      ForgetLocked(*queue, queued);
      batch.requests.push_back(std::move(queued));
      queue->requests.pop_front();
    }
    batch.charged_ns = item_cost * count;
    batch.dispatched = now;
    chosen->deficit_ns -= batch.charged_ns;
    chosen->stats.dispatched += count;
    ++chosen->stats.batches;
    chosen->stats.charged_time += absl::Nanoseconds(batch.charged_ns);
    // Deficit round robin: a tenant with credit left keeps the turn, otherwise the next one.
    ring.cursor = chosen->deficit_ns > 0 ? chosen_index : (chosen_index + 1) % ring.tenants.size();
    chosen->next_active = (queue_index + 1) % chosen->active.size();  // round robin over models
    RetireIfEmptyLocked(queue);
    return true;
  }
  return false;
}

void Scheduler::FillSlotsLocked(absl::Time now, std::vector<Batch>& batches) {
  holdback_until_ = absl::InfinitePast();  // HoldBackLocked sets it again if it still holds
  int workers = static_cast<int>(workers_.size());
  std::vector<int> order;
  while (queued_count_ > 0 && total_in_flight_ < options_.max_batches_in_flight * workers) {
    // Least busy worker first, starting after the one that got the last batch.
    order.clear();
    for (int i = 0; i < workers; ++i) {
      int worker = static_cast<int>((next_worker_ + i) % workers);
      if (in_flight_[worker] < options_.max_batches_in_flight) order.push_back(worker);
    }
    std::stable_sort(order.begin(), order.end(),
                     [this](int a, int b)
                         ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_[a] < in_flight_[b]; });
    bool took = false;
    for (int worker : order) {
      Batch batch;
      if (!TakeBatchLocked(worker, now, in_flight_[worker] >= SharedSlotsLocked(now), batch)) {
        continue;
      }
      ++in_flight_[worker];
      ++total_in_flight_;
      next_worker_ = (worker + 1) % workers;
      batches.push_back(std::move(batch));
      took = true;
      break;
    }
    if (!took) return;
  }
}

absl::Time Scheduler::NextWakeLocked() const {
  absl::Time wake = earliest_deadline_;
  const absl::Time now = clock_->Now();
  const int shared_slots = SharedSlotsLocked(now);
  if (shared_slots < options_.max_batches_in_flight && realtime_queued_ == 0) {
    wake = std::min(wake, last_realtime_arrival_ + options_.realtime_activity_window);
  }
  for (const Ring& ring : rings_) {
    for (const Tenant* tenant : ring.tenants) {
      // Only realtime work may take a worker's reserved slots; when the reservation lapses the
      // other classes may fill them, so look again then.
      const int slots = tenant->limits->priority == PriorityClass::kRealtime
                            ? options_.max_batches_in_flight
                            : shared_slots;
      for (const Queue* queue : tenant->active) {
        bool has_slot = false;
        if (queue->worker == kAnyWorker) {
          for (int in_flight : in_flight_) has_slot = has_slot || in_flight < slots;
        } else {
          has_slot = in_flight_[queue->worker] < slots;
        }
        if (!has_slot) continue;
        absl::Time ready_at = FlushTimeLocked(*queue);
        // Held back for a realtime request: look again when the hold ends (or when woken).
        if (tenant->limits->priority != PriorityClass::kRealtime && holdback_until_ > now) {
          ready_at = std::max(ready_at, holdback_until_);
        }
        wake = std::min(wake, ready_at);
      }
    }
  }
  return wake;
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
    } else {
      ExpireLocked(now, answers);
      FillSlotsLocked(now, batches);
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

    for (auto& [done, outcome] : answers) done(std::move(outcome));
    for (Batch& batch : batches) Dispatch(std::move(batch));
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
      const int64_t left = absl::ToInt64Nanoseconds(queued.deadline - now);
      queued.item.set_time_left_ns(left == 0 ? -1 : left);
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
  measured_ns = std::max<int64_t>(measured_ns, kMinItemCostNs * count);
  Tenant& tenant = tenants_.find(tenant_id)->second;
  tenant.deficit_ns -= measured_ns - charged_ns;
  tenant.stats.charged_time += absl::Nanoseconds(measured_ns - charged_ns);
  int64_t per_item = measured_ns / count;
  auto [it, inserted] = item_cost_ns_.try_emplace(model_handle, per_item);
  if (!inserted) {
    it->second +=
        static_cast<int64_t>(options_.cost_smoothing * static_cast<double>(per_item - it->second));
    it->second = std::max(it->second, kMinItemCostNs);
  }
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
    SealedReplyItem& item = (*replies)[static_cast<int>(i)];
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

}  // namespace cloister::host
