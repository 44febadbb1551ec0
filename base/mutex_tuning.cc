#include "base/mutex_tuning.h"

#include "absl/synchronization/mutex.h"

namespace cloister {

bool SkipRunTimeDeadlockDetection() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
#else
  return false;
#endif
}

}  // namespace cloister
