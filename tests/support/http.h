// Test support: a minimal HTTP/1.0 GET over loopback, for scraping cloisterd's /metrics page in
// integration tests without an HTTP client library. Thread-safe (no shared state).
#pragma once

#include <string>

namespace cloister::testing {

// GET http://HOST:PORT/PATH; the whole response (headers and body), empty when unreachable.
std::string HttpGet(const std::string& host_port, const std::string& path);

}  // namespace cloister::testing
