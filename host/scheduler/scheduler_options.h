// Scheduler options: priority classes, per-tenant limits and the scheduler's settings, with
// their validation (DESIGN.md section 7; the Scheduler itself is in scheduler.h). Plain data,
// checked once when a Scheduler is created or a configuration is loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

// Strict priority between classes: realtime before standard before batch (best effort).
enum class PriorityClass { kRealtime = 0, kStandard = 1, kBatch = 2 };
inline constexpr int kPriorityClassCount = 3;

// "realtime", "standard", "batch".
absl::string_view PriorityClassName(PriorityClass priority);
// The inverse of PriorityClassName; InvalidArgument for another word.
absl::StatusOr<PriorityClass> ParsePriorityClass(absl::string_view name);

// What one tenant may queue and how it is scheduled.
struct TenantLimits {
  PriorityClass priority = PriorityClass::kStandard;
  int weight = 1;                  // 1..10000: share of execution time within its class
  double rate_per_second = 0;      // token bucket refill; 0: no rate limit
  double burst = 0;                // bucket size in requests; 0: max(1, rate_per_second)
  int max_queued_requests = 1024;  // queued, not yet dispatched; >= 1
  uint64_t max_queued_size = uint64_t{256} << 20;  // ciphertext bytes queued; >= 1
  uint64_t max_payload_size = uint64_t{64} << 20;  // one request's ciphertext; >= 1
  // Applies to requests that carry no deadline of their own.
  absl::Duration default_deadline = absl::InfiniteDuration();
  // The longest deadline any request gets, its own included (the enclave stops a run past it).
  absl::Duration max_deadline = absl::InfiniteDuration();
  // Sum of the tenant's stored model sizes. Checked by the service at upload; the scheduler
  // does not use it.
  uint64_t model_memory_quota = uint64_t{4} << 30;
  // Generation: streams at once (checked by the service) and the token limits the enclave
  // enforces (GenerateLimits; 0: none). The scheduler does not use them.
  int max_generations = 64;
  uint64_t max_tokens = 0;
  uint64_t kv_cache_tokens = 0;
  double tokens_per_second = 0;
  double token_burst = 0;
};

// InvalidArgument naming the field when a limit is out of range.
absl::Status CheckTenantLimits(const TenantLimits& limits);

// What the scheduler saw of one finished batch, for metrics (SchedulerOptions::on_batch_done).
// Counts and times only: no model handle, no sizes.
struct BatchObservation {
  int worker = 0;
  std::string tenant_id;
  PriorityClass priority = PriorityClass::kStandard;
  int count = 0;                            // requests in the batch
  std::vector<absl::Duration> queue_waits;  // per request: enqueued to dispatched
  absl::Duration execution;                 // dispatched to answered
  bool ok = false;                          // the enclave answered the batch as a whole
};

struct SchedulerOptions {
  int max_batch_size = 8;                                  // 1..1024 requests
  std::vector<int> preferred_batch_sizes;                  // ascending, each 1..max_batch_size
  absl::Duration max_queue_delay = absl::Milliseconds(2);  // 0..10 s
  // Waiting for a batch to fill only pays when company comes. With this on, a queue is sent at
  // once, without waiting out max_queue_delay, while its tenant's requests rarely arrive within
  // max_queue_delay of each other (fewer than one in four, smoothed over the last few): a
  // closed-loop client that sends its next request after the last answer, or a slow steady
  // stream, then pays no queue delay at all, while bursts and busy tenants still batch.
  bool adaptive_queue_delay = true;
  int max_batches_in_flight = 2;  // per enclave worker, 1..64
  // While realtime requests wait, a batch-class batch holds at most this many requests (and
  // never more than max_batch_size) and at most `best_effort_max_batch_time` of estimated
  // execution (but always at least one request). Between the requests of periodic realtime
  // tenants (see realtime_arrival_guard) with none queued, a batch may instead take as many
  // requests as its estimated execution fits before the next realtime request is due.
  int best_effort_max_batch_size = 2;                                 // 1..1024
  absl::Duration best_effort_max_batch_time = absl::Milliseconds(5);  // > 0
  // The caps also hold for this long after a realtime request arrived, even when none is queued
  // at the moment: a realtime tenant at a moderate rate has an empty queue most of the time, and
  // its next request must not find a full best-effort batch in the way. 0: only while queued.
  absl::Duration realtime_activity_window = absl::Seconds(1);  // 0..60 s
  // In-flight slots per worker that only realtime batches may take while realtime work is active
  // (as for the caps above), 0..64, of which at most max_batches_in_flight - 1 count. A worker
  // runs its batches concurrently (the enclave serves calls on several threads; a GPU runs them
  // on separate streams), so a realtime request that arrives while other batches fill the rest
  // starts at once instead of waiting behind them. Without realtime activity every slot is
  // shared.
  int realtime_reserved_slots = 0;
  // Periodic realtime tenants (a frame every N ms, as audio and video streams send): once a
  // realtime tenant's arrivals are regular, a batch of another class whose estimated execution
  // would still run when its next request is due, give or take this guard, is held back until
  // that request has come (or is overdue by the guard plus how late that tenant's requests have
  // lately come, at most a quarter period), so the request finds the worker free.
  // Holding back never idles a worker while another worker is idle. 0 turns it off.
  absl::Duration realtime_arrival_guard = absl::Milliseconds(1);  // 0..1 s
  // Deficit round robin: credit per round per unit of weight, in execution time.
  absl::Duration fairness_quantum = absl::Milliseconds(2);  // > 0
  // Per-request cost of a model before its first batch is measured.
  absl::Duration initial_item_cost = absl::Milliseconds(1);  // > 0
  double cost_smoothing = 0.25;  // EWMA weight of the newest measurement, (0, 1]
  // Limits for tenants not listed in `tenant_limits`.
  TenantLimits default_limits;
  std::map<std::string, TenantLimits> tenant_limits;
  Clock* clock = nullptr;  // nullptr: Clock::Real()
  // When set, sees every batch's raw reply (e.g. to keep the enclave's usage receipt) on the
  // completion thread, before the requests are answered. Must not block or call the scheduler.
  std::function<void(int worker, const EnclaveClient::Reply& reply)> on_batch_reply;
  // When set, sees every finished batch's counts and times on the completion thread, after its
  // requests are answered. Must not block or call the scheduler.
  std::function<void(const BatchObservation& batch)> on_batch_done;
};

// InvalidArgument naming the option when one is out of range.
absl::Status CheckSchedulerOptions(const SchedulerOptions& options);

}  // namespace cloister::host
