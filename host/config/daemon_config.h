// cloisterd's settings: the command line and the operator's YAML config file (`--config FILE`).
// The schema is proto/cloister/config/v1/daemon.proto (message Daemon); every key:
//
//   listen: "127.0.0.1:7700"           # HOST:PORT; port 0 picks a free port
//   data_dir: ./cloister-data          # created 0700
//   enclave_binary: /path/cloister-enclave   # default: next to the cloisterd executable
//   tee: sim                           # where the enclave's evidence comes from: sim, sev-snp, tdx
//   gpu: nvidia-cc                     # GPU evidence: sim, nvidia-cc, none (default: sim with
//                                      # tee sim, none otherwise); nvidia-cc needs a real TEE
//   workers: 1                         # enclave worker processes, one per device; 1..64
//   scheduler:                         # (also accepted under its older name `batching`)
//     max_batch_size: 8                # 1..1024
//     preferred_batch_sizes: [4, 8]    # ascending, each <= max_batch_size
//     max_queue_delay_ms: 2            # 0..10000, fractions allowed
//     max_batches_in_flight: 2         # per worker, 1..64
//     best_effort_max_batch_size: 2    # batch-class batches while realtime work waits
//     best_effort_max_batch_time_ms: 5 # ... and their estimated duration
//     fairness_quantum_ms: 2           # deficit round robin credit per round and weight unit
//     realtime_activity_window_ms: 1000  # caps hold this long after a realtime arrival
//   tenant_defaults:                   # limits for tenants that do not set them (and "demo")
//     <any tenant limit below>
//   tenants:                           # absent or empty: the development tenant "demo"
//     - id: acme
//       token_sha256: <64 hex digits>  # SHA-256 of the tenant's API token
//       priority: realtime             # realtime, standard (default), batch
//       weight: 1                      # 1..10000, share of execution time within the class
//       rate_per_second: 50            # token bucket; 0 (default): unlimited
//       burst: 100                     # bucket size; default max(1, rate)
//       max_queued_requests: 1024
//       max_queued_bytes: 256MiB       # sizes: bytes, or with KiB, MiB, GiB, TiB
//       max_payload_bytes: 64MiB
//       model_memory_quota_bytes: 4GiB # sum of the tenant's stored models, checked at upload
//       default_deadline_ms: 1000      # for requests without a deadline; default none
//
// Errors are "FILE:LINE: field: what" (unknown fields and wrong types included).
// Flags override the file. Thread-safe: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "host/scheduler/scheduler.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {

inline constexpr char kCloisterdUsage[] =
    "usage: cloisterd [--config FILE] [--listen HOST:PORT] [--data-dir DIR] "
    "[--enclave-binary PATH] [--tee sim|sev-snp|tdx] [--gpu sim|nvidia-cc|none]";

// One configured tenant: its credential and its limits.
struct TenantConfig {
  std::string tenant_id;
  Bytes token_sha256;  // 32 bytes
  TenantLimits limits;
};

struct DaemonConfig {
  std::string listen = "127.0.0.1:7700";
  std::string data_dir = "./cloister-data";
  std::string enclave_binary;  // empty: cloister-enclave beside the cloisterd executable
  std::string tee = "sim";     // sim, sev-snp, tdx
  std::string gpu;             // sim, nvidia-cc, none; empty: sim with tee sim, else none
  int workers = 1;
  // Scheduler settings; default_limits holds tenant_defaults and tenant_limits each tenant's
  // limits (clock is left unset).
  SchedulerOptions scheduler;
  std::vector<TenantConfig> tenants;  // empty: the development tenant

  // The credentials of the configured tenants, for TenantRegistry.
  std::vector<TenantCredential> Credentials() const;
};

// Parses config text; `file_name` is only used in error messages. Empty text gives defaults.
absl::StatusOr<DaemonConfig> ParseDaemonConfig(absl::string_view yaml_text,
                                               absl::string_view file_name);
// Reads and parses a config file.
absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path);

struct CommandLine {
  std::optional<std::string> config_path;
  std::optional<std::string> listen;
  std::optional<std::string> data_dir;
  std::optional<std::string> enclave_binary;
  std::optional<std::string> tee;
  std::optional<std::string> gpu;
  bool help = false;
};

// Parses `--flag VALUE` and `--flag=VALUE` forms. InvalidArgument with a one-line message for an
// unknown flag, a missing value or a stray argument.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

// The effective settings: the config file (if any) with the flags applied on top, validated.
absl::StatusOr<DaemonConfig> ResolveDaemonConfig(const CommandLine& command_line);

// The TEE and GPU choices together: each a known word, a simulated GPU only with a simulated
// TEE, a real NVIDIA GPU only with a real TEE. InvalidArgument with one line otherwise.
absl::Status CheckEvidenceSources(absl::string_view tee, absl::string_view gpu);

// HOST:PORT with a port in 0..65535 (an IPv6 host in brackets). InvalidArgument otherwise.
absl::Status CheckListenAddress(absl::string_view listen);
// The HOST part of a valid HOST:PORT.
std::string ListenHost(absl::string_view listen);

}  // namespace cloister::host
