// TokenBucket: one tenant's request-rate limit (TenantLimits::rate_per_second and burst). The
// bucket holds up to `burst` tokens, refills at `rate_per_second` and each admitted request
// takes one.
//
// A plain value with no clock and no lock: the caller passes the time to every call and guards
// the bucket (the Scheduler's mutex). Limits are as CheckTenantLimits allows.
#pragma once

#include "absl/time/time.h"

namespace cloister::host {

class TokenBucket {
 public:
  // rate_per_second 0: no limit. burst 0: max(1, rate_per_second). Full at `now`.
  TokenBucket(double rate_per_second, double burst, absl::Time now);

  // Refills for the time since the last refill (none for a clock that went back), then takes one
  // token: true, or false (and nothing taken) while less than one is left. Always true without
  // a limit.
  bool TryTake(absl::Time now);

  double rate_per_second() const { return rate_per_second_; }
  // The bucket's size (burst, or its default).
  double burst() const { return burst_; }
  double tokens() const { return tokens_; }

 private:
  double rate_per_second_;
  double burst_;
  double tokens_;
  absl::Time refilled_;
};

}  // namespace cloister::host
