// ArrivalPredictor: learns the period of one realtime tenant's requests (a frame every N ms, as
// audio and video streams send) and predicts when the next one is due, for the Scheduler's
// hold-backs and gap-filling (SchedulerOptions::realtime_arrival_guard).
//
// What it keeps: a smoothed gap between arrivals and a smoothed distance of each gap from it
// (the jitter); the period is trusted once four gaps agree within a quarter of it, and only up
// to 1 s. A sender that comes late against its expected time (a clock-driven sender delayed
// once) keeps its schedule: the next request is expected a gap after the late one was due. A
// gap of more than one and a half trusted periods is a break in the stream, not a new period;
// three breaks in a row are a new pace, learnt afresh.
//
// A plain value with no clock and no lock: the caller passes the time to every call and guards
// the predictor (the Scheduler's mutex). Times passed to Arrived() never go back.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace cloister::host {

class ArrivalPredictor {
 public:
  // Notes a request that arrived at `now`.
  void Arrived(absl::Time now);

  // Whether the arrivals are regular enough to plan around (see the file comment).
  bool PeriodTrusted() const;

  // With a trusted period, the time from `now` until the next request is due, less `guard` and
  // the jitter; zero when it is due or overdue. Zero as well without a trusted period.
  absl::Duration RoomBefore(absl::Time now, absl::Duration guard) const;

  // With a trusted period, whether a batch that starts at `now` and runs for `cost` would still
  // run when the next request is due, give or take `guard`, while that request is not overdue
  // by more than the guard, the jitter and the recent lateness (at most a quarter period). Then
  // the time until which the batch waits for it; otherwise (untrusted too) InfinitePast.
  absl::Time HoldBackUntil(absl::Time now, absl::Duration cost, absl::Duration guard) const;

  // Arrivals seen (capped at about a million; reset to one when a new pace is learnt).
  int arrival_count() const { return arrivals_; }
  // InfinitePast before the first arrival.
  absl::Time last_arrival() const { return last_arrival_; }
  absl::Time next_due() const { return next_due_; }
  absl::Duration period() const { return absl::Nanoseconds(gap_ns_); }
  absl::Duration jitter() const { return absl::Nanoseconds(jitter_ns_); }
  absl::Duration lateness() const { return absl::Nanoseconds(late_ns_); }

 private:
  absl::Time last_arrival_ = absl::InfinitePast();
  // When the next request is expected: a gap after the last one, or, when the last one came
  // late against its own expected time, a gap after that expected time.
  absl::Time next_due_ = absl::InfinitePast();
  int64_t gap_ns_ = 0;     // smoothed gap between arrivals
  int64_t jitter_ns_ = 0;  // smoothed distance of a gap from gap_ns_
  // How late against next_due_ requests have come lately: the largest lateness seen, decaying
  // by 1/256 per arrival (a half-life of about 180 arrivals). The rare late request (a sender's
  // timer firing a millisecond or more late) is what jitter_ns_, an average, forgets at once; a
  // hold-back lasts this long past the due time.
  int64_t late_ns_ = 0;
  // Gaps in a row longer than one and a half trusted periods.
  int breaks_ = 0;
  int arrivals_ = 0;
};

}  // namespace cloister::host
