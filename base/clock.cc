#include "base/clock.h"

namespace cloister {
namespace {
class SystemClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
}  // namespace

Clock* Clock::Real() {
  static SystemClock* clock = new SystemClock;
  return clock;
}

}  // namespace cloister
