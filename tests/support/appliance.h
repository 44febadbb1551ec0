// Test support: a running cloisterd (which spawns the real cloister-enclave) on a loopback port
// with its own data dir, for end-to-end tests that drive it with the real `cloister` CLI.
// Not thread-safe; one owner per Appliance. The Appliance owns the cloisterd child process and
// stops it (SIGTERM) when destroyed.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sdk/client.h"
#include "tests/support/process.h"

namespace cloister::testing {

class Appliance {
 public:
  // `extra_args` go after the address and data dir flags (e.g. --config FILE, whose operator
  // section should then take free ports: `listen: 127.0.0.1:0`; without a --config the
  // appliance passes one that does).
  Appliance(std::string cloisterd_binary, std::string data_dir,
            std::vector<std::string> extra_args = {})
      : cloisterd_binary_(std::move(cloisterd_binary)),
        data_dir_(std::move(data_dir)),
        extra_args_(std::move(extra_args)) {}
  ~Appliance() { Stop(); }

  // Starts cloisterd and waits (up to a minute) until it listens; Unavailable with its stderr
  // when it does not.
  absl::Status Start();
  // Stops it with SIGTERM; returns its exit code (0 when it was not running).
  int Stop();

  // host:port it listens on (after Start).
  const std::string& address() const { return address_; }
  const std::string& data_dir() const { return data_dir_; }
  // The operator gRPC address and the /metrics HOST:PORT, from its operator_listening log line
  // (after Start; empty if it logged none).
  const std::string& operator_address() const { return operator_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::string Logs() const;
  // SDK options for `tenant` with `token` against this appliance (after Start): its address,
  // its development policy and a fresh identity key; callers set the rest (max_attempts, ...).
  sdk::ClientOptions TenantOptions(const std::string& tenant, const std::string& token) const;
  // cloisterd's pid (after Start; -1 before) and the pids of its live enclave workers (read
  // from /proc; empty when none is running).
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  std::vector<pid_t> WorkerPids() const;

 private:
  std::string cloisterd_binary_, data_dir_, log_dir_, address_;
  std::vector<std::string> extra_args_;
  std::string operator_address_, metrics_address_;
  std::unique_ptr<Process> process_;
};

}  // namespace cloister::testing
