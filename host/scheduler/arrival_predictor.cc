#include "host/scheduler/arrival_predictor.h"

#include <algorithm>
#include <cstdlib>

namespace cloister::host {

namespace {

// A stream whose gaps are this many breaks in a row has a new pace.
constexpr int kBreaksToRelearn = 3;

int64_t Nanos(absl::Duration duration) { return absl::ToInt64Nanoseconds(duration); }

bool Trusted(int arrivals, int64_t gap_ns, int64_t jitter_ns) {
  return arrivals >= 5 && gap_ns > 0 && gap_ns <= 1'000'000'000 && jitter_ns * 4 <= gap_ns;
}

}  // namespace

bool ArrivalPredictor::PeriodTrusted() const { return Trusted(arrivals_, gap_ns_, jitter_ns_); }

void ArrivalPredictor::Arrived(absl::Time now) {
  if (arrivals_ > 0) {
    const int64_t gap = Nanos(now - last_arrival_);
    // Learning a break as the period would take the period's trust away for dozens of
    // arrivals, and with it the hold-backs, just when the stream resumes at its old pace: the
    // period is kept and the schedule starts again from this arrival.
    const bool broken = arrivals_ > 1 && PeriodTrusted() && gap > gap_ns_ + gap_ns_ / 2;
    breaks_ = broken ? breaks_ + 1 : 0;
    if (arrivals_ == 1 || breaks_ >= kBreaksToRelearn) {
      gap_ns_ = gap;
      jitter_ns_ = gap / 2;  // unproven until a few gaps agree
      breaks_ = 0;
      if (arrivals_ > 1) arrivals_ = 1;
    } else if (broken) {
      // Period and jitter stay as learnt.
    } else {
      jitter_ns_ += (std::abs(gap - gap_ns_) - jitter_ns_) / 4;
      gap_ns_ += (gap - gap_ns_) / 4;
    }
  }
  const absl::Time expected = next_due_;
  const absl::Duration gap = absl::Nanoseconds(gap_ns_);
  const bool late = arrivals_ > 0 && expected != absl::InfinitePast() && now > expected &&
                    now - expected < gap / 2;
  late_ns_ -= late_ns_ / 256;
  if (late) late_ns_ = std::max(late_ns_, Nanos(now - expected));
  next_due_ = late ? expected + gap : now + gap;
  last_arrival_ = now;
  arrivals_ = std::min(arrivals_ + 1, 1 << 20);
}

absl::Duration ArrivalPredictor::RoomBefore(absl::Time now, absl::Duration guard) const {
  if (!PeriodTrusted()) return absl::ZeroDuration();
  return absl::Nanoseconds(
      std::max<int64_t>(0, Nanos(next_due_ - now) - Nanos(guard) - jitter_ns_));
}

absl::Time ArrivalPredictor::HoldBackUntil(absl::Time now, absl::Duration cost,
                                           absl::Duration guard) const {
  if (!PeriodTrusted()) return absl::InfinitePast();
  const int64_t guard_ns = Nanos(guard);
  const int64_t allowance = std::max(jitter_ns_, std::min(late_ns_, gap_ns_ / 4));
  const absl::Time latest = next_due_ + absl::Nanoseconds(guard_ns + allowance);
  // Due before this batch would finish, and not yet overdue beyond the allowance.
  if (now + absl::Nanoseconds(Nanos(cost) + guard_ns) >= next_due_ && now < latest) return latest;
  return absl::InfinitePast();
}

}  // namespace cloister::host
