#include "host/scheduler/scheduler_options.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cloister::host {

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

}  // namespace cloister::host
