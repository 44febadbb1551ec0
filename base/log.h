// Structured logging: one JSON object per line on stderr with a fixed field set
// (ts, level, component, event, then the call's fields; a call's field named like a fixed one
// is written as "field_NAME", so every line has exactly one of each fixed field). Every log line goes through Log();
// a field marked Secret() is printed as "[redacted]", and SecretBytes has no conversion to a
// field at all, so keys and tenant payloads cannot reach the log.
// Thread-safe: lines are written whole under a mutex.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

namespace cloister {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

struct LogField {
  LogField(std::string_view k, std::string_view v) : key(k), value(v) {}
  LogField(std::string_view k, const char* v) : key(k), value(v) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(std::string_view k, long long v) : key(k), value(std::to_string(v)), number(true) {}
  LogField(std::string_view k, int v) : LogField(k, static_cast<long long>(v)) {}
  LogField(std::string_view k, long v) : LogField(k, static_cast<long long>(v)) {}
  LogField(std::string_view k, unsigned long v) : key(k), value(std::to_string(v)), number(true) {}
  LogField(std::string_view k, unsigned v) : LogField(k, static_cast<unsigned long>(v)) {}
  std::string key;
  std::string value;
  bool number = false;
  bool secret = false;
};

// Marks a field as secret: its value never appears in output.
inline LogField Secret(std::string_view key) {
  LogField f(key, "");
  f.secret = true;
  return f;
}

void SetLogComponent(std::string_view component);  // e.g. "cloisterd", "enclave"
void SetMinLogLevel(LogLevel level);
// Test hook: receives each formatted line instead of stderr (nullptr restores stderr).
void SetLogSinkForTest(std::function<void(const std::string&)> sink);

void Log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});

}  // namespace cloister
