#include "tests/resources/process_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/support/process.h"

namespace cloister::testing {
namespace {

// The value in bytes of a "Name:   1234 kB" line of /proc/PID/status.
bool ParseKilobytesLine(const std::string& line, absl::string_view name, uint64_t& size) {
  if (!absl::StartsWith(line, name) || line.size() <= name.size() || line[name.size()] != ':') {
    return false;
  }
  std::string value(absl::StripAsciiWhitespace(absl::string_view(line).substr(name.size() + 1)));
  if (!absl::EndsWith(value, " kB")) return false;
  uint64_t kilobytes = 0;
  if (!absl::SimpleAtoi(value.substr(0, value.size() - 3), &kilobytes)) return false;
  size = kilobytes * 1024;
  return true;
}

}  // namespace

absl::StatusOr<ProcessMemory> ReadProcessMemory(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/status"));
  if (!file) return absl::NotFoundError(absl::StrCat("no process ", pid));
  ProcessMemory memory;
  bool has_rss = false, has_peak = false;
  for (std::string line; std::getline(file, line);) {
    has_rss = has_rss || ParseKilobytesLine(line, "VmRSS", memory.rss_size);
    has_peak = has_peak || ParseKilobytesLine(line, "VmHWM", memory.peak_rss_size);
  }
  if (!has_rss || !has_peak) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/status has no VmRSS or VmHWM"));
  }
  return memory;
}

std::string Mebibytes(uint64_t size) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(size) / (1 << 20));
}

MemoryWatch::MemoryWatch(pid_t cloisterd, absl::Duration period) : cloisterd_(cloisterd) {
  Sample();
  thread_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) Sample();
  });
}

MemoryWatch::~MemoryWatch() {
  stop_.Notify();
  thread_.join();
}

void MemoryWatch::Sample() {
  uint64_t cloisterd = 0, workers = 0;
  if (auto memory = ReadProcessMemory(cloisterd_); memory.ok()) cloisterd = memory->rss_size;
  for (pid_t worker : EnclaveWorkers(cloisterd_)) {
    if (auto memory = ReadProcessMemory(worker); memory.ok()) workers += memory->rss_size;
  }
  absl::MutexLock lock(&mu_);
  max_cloisterd_ = std::max(max_cloisterd_, cloisterd);
  max_workers_ = std::max(max_workers_, workers);
  ++samples_;
}

uint64_t MemoryWatch::max_cloisterd_rss_size() const {
  absl::MutexLock lock(&mu_);
  return max_cloisterd_;
}

uint64_t MemoryWatch::max_workers_rss_size() const {
  absl::MutexLock lock(&mu_);
  return max_workers_;
}

int MemoryWatch::samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

}  // namespace cloister::testing
