// Test support: a running cloisterd (which spawns the real cloister-enclave) on a loopback port
// with its own data dir, for end-to-end tests that drive it with the real `cloister` CLI.
// Not thread-safe; one owner per Appliance. The Appliance owns the cloisterd child process and
// stops it (SIGTERM) when destroyed.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "tests/support/process.h"

namespace cloister::testing {

class Appliance {
 public:
  Appliance(std::string cloisterd_binary, std::string data_dir)
      : cloisterd_binary_(std::move(cloisterd_binary)), data_dir_(std::move(data_dir)) {}
  ~Appliance() { Stop(); }

  // Starts cloisterd and waits (up to a minute) until it listens; Unavailable with its stderr
  // when it does not.
  absl::Status Start();
  // Stops it with SIGTERM; returns its exit code (0 when it was not running).
  int Stop();

  // host:port it listens on (after Start).
  const std::string& address() const { return address_; }
  const std::string& data_dir() const { return data_dir_; }
  std::string Logs() const;

 private:
  std::string cloisterd_binary_, data_dir_, log_dir_, address_;
  std::unique_ptr<Process> process_;
};

}  // namespace cloister::testing
