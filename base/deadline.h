// Deadline: an instant on a given clock, or none. Work that stops at a deadline asks passed(),
// which reads the clock the deadline was set on, so that a test clock drives a deadline from
// where it is set to where it is checked.
//
// Threading: a value type; passed() is as thread-safe as its clock. Ownership: borrows the
// clock, which must outlive every copy.
#pragma once

#include "absl/time/time.h"
#include "base/clock.h"

namespace cloister {

class Deadline {
 public:
  // No deadline: passed() is always false.
  Deadline() = default;
  static Deadline At(absl::Time when, const Clock* clock) { return Deadline(when, clock); }
  // The later of two deadlines (a run shared by several requests lasts until the last of them
  // gives up): none when either is none.
  static Deadline Later(const Deadline& a, const Deadline& b) {
    if (!a.is_set() || !b.is_set()) return Deadline();
    return a.when_ >= b.when_ ? a : b;
  }

  bool is_set() const { return clock_ != nullptr; }
  bool passed() const { return clock_ != nullptr && clock_->Now() >= when_; }

 private:
  Deadline(absl::Time when, const Clock* clock) : when_(when), clock_(clock) {}

  absl::Time when_ = absl::InfiniteFuture();
  const Clock* clock_ = nullptr;
};

}  // namespace cloister
