// absl::Duration <-> google.protobuf.Duration, for the durations that cross the wire as messages
// (a message field has presence, so "absent" need not be a reserved number).
//
// Threading: pure functions.
#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"

namespace cloister::proto {

// Infinite durations saturate at the largest finite ones a Duration can hold.
inline google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  const int64_t nanos = absl::ToInt64Nanoseconds(d);  // saturates for infinite durations
  google::protobuf::Duration out;
  out.set_seconds(nanos / 1'000'000'000);
  out.set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
  return out;
}

// Out-of-range fields (a Duration from a peer is not trusted) saturate instead of overflowing.
inline absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace cloister::proto
