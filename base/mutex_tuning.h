// Process-wide absl::Mutex settings for Cloister's own programs.
//
// Debian's abseil is built without NDEBUG, so by default every absl::Mutex Lock and Unlock runs
// abseil's run-time deadlock detector: it looks the mutex up in a global graph of lock
// orders under a global lock. On the enclave's transfer path that was 5 % of the CPU time of a
// batch of small requests (perf: GraphCycles::GetId under Mutex::Lock and Unlock), and every
// lock in the scheduler, the broker and the boundary pays it. Cloister checks its lock
// annotations at compile time instead (the tsa preset, -Werror=thread-safety), so release builds
// turn the run-time detector off; debug builds and the tests keep it.
//
// Not for libraries (the SDK leaves its host application's settings alone).
#pragma once

namespace cloister {

// In a build with NDEBUG (Release, RelWithDebInfo): sets abseil's deadlock detection to
// kIgnore and returns true. Otherwise changes nothing and returns false. Call first in main(),
// before any mutex is used.
bool SkipRunTimeDeadlockDetection();

}  // namespace cloister
