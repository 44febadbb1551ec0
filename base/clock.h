// Clock: the one source of time, so tests can use a fake. SystemClock is thread-safe;
// FakeClock is thread-safe too (atomic), and only moves when a test advances it.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cloister {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process-wide real clock.
  static Clock* Real();
};

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000))
      : nanos_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(nanos_.load()); }
  void Advance(absl::Duration d) { nanos_ += absl::ToInt64Nanoseconds(d); }

 private:
  std::atomic<int64_t> nanos_;
};

}  // namespace cloister
