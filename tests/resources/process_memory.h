// Test support for the resource tests: what a running process holds in memory, read from
// /proc/PID/status (VmRSS: resident now; VmHWM: the most it was ever resident), cloisterd's
// enclave workers found as its children in /proc, and a MemoryWatch that samples both while a
// test drives load, so a test can assert that an attack leaves memory bounded.
// Threading: the free functions are thread-safe; a MemoryWatch samples on its own thread and
// its accessors may be called from any thread. Ownership: a MemoryWatch owns its thread and
// stops it when destroyed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace cloister::testing {

// A memory bound of `mib` MiB of growth as the tests state it for the default build. In a
// sanitizer build (CLOISTER_SANITIZED) AddressSanitizer keeps freed blocks in a quarantine of
// 256 MiB and pads every allocation with redzones, so the growth it measures says nothing
// about Cloister's own: the bound gets that much slack (the tight bounds are checked by the
// default build, which is what CI runs).
constexpr uint64_t GrowthBound(uint64_t mib) {
#if defined(CLOISTER_SANITIZED)
  return (mib << 20) + (uint64_t{512} << 20);
#else
  return mib << 20;
#endif
}

struct ProcessMemory {
  uint64_t rss_size = 0;       // VmRSS, bytes
  uint64_t peak_rss_size = 0;  // VmHWM, bytes
};

// NotFound when the process is gone, Internal when its status lacks the fields.
absl::StatusOr<ProcessMemory> ReadProcessMemory(pid_t pid);


// "123.4 MiB".
std::string Mebibytes(uint64_t size);

// Samples, every `period`, cloisterd's VmRSS and the summed VmRSS of its enclave workers
// (looked up again each time, so a restarted worker is followed), keeping the largest of each.
class MemoryWatch {
 public:
  MemoryWatch(pid_t cloisterd, absl::Duration period = absl::Milliseconds(20));
  ~MemoryWatch();
  MemoryWatch(const MemoryWatch&) = delete;
  MemoryWatch& operator=(const MemoryWatch&) = delete;

  uint64_t max_cloisterd_rss_size() const;
  uint64_t max_workers_rss_size() const;
  int samples() const;

 private:
  void Sample();

  const pid_t cloisterd_;
  mutable absl::Mutex mu_;
  uint64_t max_cloisterd_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_workers_ ABSL_GUARDED_BY(mu_) = 0;
  int samples_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace cloister::testing
