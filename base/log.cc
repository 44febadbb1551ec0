#include "base/log.h"

#include <cstdio>
#include <ctime>
#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"

namespace cloister {
namespace {

// The settings every Log call reads, and the writes they serialize.
struct LogState {
  absl::Mutex mu;
  std::string component ABSL_GUARDED_BY(mu) = "cloister";
  std::function<void(const std::string&)> sink ABSL_GUARDED_BY(mu);
};
LogState& State() {
  static LogState* const state = new LogState();  // never destroyed
  return *state;
}
// Read without the mutex: a filtered-out call (the hot paths' debug logs) costs one load.
std::atomic<LogLevel>& MinLevel() {
  static std::atomic<LogLevel> level{LogLevel::kInfo};
  return level;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

void AppendJsonString(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

}  // namespace

void SetLogComponent(std::string_view component) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.component = std::string(component);
}

void SetMinLogLevel(LogLevel level) { MinLevel().store(level, std::memory_order_relaxed); }

void SetLogSinkForTest(std::function<void(const std::string&)> sink) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.sink = std::move(sink);
}

void Log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (level < MinLevel().load(std::memory_order_relaxed)) return;
  LogState& state = State();
  std::string component;
  {
    absl::MutexLock lock(&state.mu);
    component = state.component;
  }
  // The line is built outside the lock; only the write is serialized.
  std::string line = "{\"ts\":";
  AppendJsonString(line, absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()));
  line += ",\"level\":";
  AppendJsonString(line, LevelName(level));
  line += ",\"component\":";
  AppendJsonString(line, component);
  line += ",\"event\":";
  AppendJsonString(line, event);
  for (const LogField& f : fields) {
    line.push_back(',');
    // The fixed fields cannot be shadowed by a call's own field of the same name.
    if (f.key == "ts" || f.key == "level" || f.key == "component" || f.key == "event") {
      AppendJsonString(line, "field_" + f.key);
    } else {
      AppendJsonString(line, f.key);
    }
    line.push_back(':');
    if (f.secret) {
      AppendJsonString(line, "[redacted]");
    } else if (f.number) {
      line += f.value;
    } else {
      AppendJsonString(line, f.value);
    }
  }
  line += "}\n";
  absl::MutexLock lock(&state.mu);
  if (state.sink) {
    state.sink(line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
}

namespace internal {
void CheckFailed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "internal invariant failed at %s:%d: %s\n", file, line, condition);
  std::abort();
}
}  // namespace internal

}  // namespace cloister
