// The Scheduler's choice of the next batch: when a queue is ready, which tenant's queue goes
// next (strict priority between classes, deficit round robin within one), how large the batch
// is, whether it makes way for a periodic realtime request, and when the batcher must look
// again. Every function here runs with the Scheduler's mutex held.
#include <algorithm>
#include <optional>
#include <vector>

#include "base/status.h"
#include "host/scheduler/scheduler.h"

namespace cloister::host {

namespace {

int64_t Nanos(absl::Duration duration) { return absl::ToInt64Nanoseconds(duration); }

}  // namespace

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
  return Nanos(cost_model_.ItemCost(model_handle));
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

std::optional<int64_t> Scheduler::RealtimeRoomLocked(absl::Time now) const {
  if (options_.realtime_arrival_guard <= absl::ZeroDuration() || realtime_queued_ > 0) {
    return std::nullopt;
  }
  const absl::Duration guard = options_.realtime_arrival_guard;
  std::optional<int64_t> room;
  for (const Tenant* tenant : realtime_tenants_) {
    const ArrivalPredictor& predictor = tenant->predictor;
    if (now - predictor.last_arrival() >= options_.realtime_activity_window) continue;  // quiet
    if (!predictor.PeriodTrusted()) return std::nullopt;
    const int64_t until = Nanos(predictor.RoomBefore(now, guard));
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
  const absl::Duration cost = absl::Nanoseconds(cost_ns);
  absl::Time until = absl::InfinitePast();
  for (const Tenant* tenant : realtime_tenants_) {
    until = std::max(until,
                     tenant->predictor.HoldBackUntil(now, cost, options_.realtime_arrival_guard));
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

}  // namespace cloister::host
