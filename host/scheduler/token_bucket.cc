#include "host/scheduler/token_bucket.h"

#include <algorithm>

namespace cloister::host {

TokenBucket::TokenBucket(double rate_per_second, double burst, absl::Time now)
    : rate_per_second_(rate_per_second),
      burst_(burst > 0 ? burst : std::max(1.0, rate_per_second)),
      tokens_(burst_),
      refilled_(now) {}

bool TokenBucket::TryTake(absl::Time now) {
  if (rate_per_second_ <= 0) return true;
  const double refill = absl::ToDoubleSeconds(now - refilled_) * rate_per_second_;
  if (refill > 0) {
    tokens_ = std::min(burst_, tokens_ + refill);
    refilled_ = now;
  }
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

}  // namespace cloister::host
