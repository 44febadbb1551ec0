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
//     realtime_arrival_guard_ms: 1     # make way for a periodic realtime arrival; 0: off
//     realtime_reserved_slots: 0       # in-flight slots per worker kept for realtime work
//   tenant_defaults:                   # limits for tenants that do not set them (and "demo")
//     <any tenant limit below>
//   tenants:                           # absent or empty: the development tenant "demo"
//     - id: acme
//       token_sha256: <64 hex digits>  # SHA-256 of the tenant's API token; optional with
//                                      # mtls_identities (then the certificate alone admits)
//       mtls_identities: [spiffe://example.org/acme]  # needs tls.client_ca_file
//       attestation_policy: production # a name from attestation_policies
//       priority: realtime             # realtime, standard (default), batch
//       weight: 1                      # 1..10000, share of execution time within the class
//       rate_per_second: 50            # token bucket; 0 (default): unlimited
//       burst: 100                     # bucket size; default max(1, rate)
//       max_queued_requests: 1024
//       max_queued_bytes: 256MiB       # sizes: bytes, or with KiB, MiB, GiB, TiB
//       max_payload_bytes: 64MiB
//       model_memory_quota_bytes: 4GiB # sum of the tenant's stored models, checked at upload
//       default_deadline_ms: 1000      # for requests without a deadline; default none
//       max_deadline_ms: 30000         # caps every request's deadline, its own too; default none
//   tls:                               # TLS on the tenant port (files relative to this file)
//     cert_file: tls/server.crt
//     key_file: tls/server.key
//     client_ca_file: tls/clients-ca.crt   # optional: mutual TLS
//     require_client_cert: false
//   operator:
//     listen: unix:/run/cloister/operator.sock   # or loopback HOST:PORT (default 127.0.0.1:7701)
//     metrics_listen: 127.0.0.1:7702   # Prometheus /metrics (default: operator port + 1)
//     allow_remote: false              # needed for a HOST:PORT that is not loopback
//   devices:                           # one enclave worker each; replaces `workers`
//     - name: gpu0
//       gpu: nvidia-cc                 # default: the daemon's gpu
//       executor: cuda                 # auto (default), cpu, cuda
//       pcie_mode: driver              # driver, emulated, off; default: the worker's choice
//       pci_address: "0000:c1:00.0"
//       run_threads: 4                 # CPU executor: runs per batch side by side, 1..64
//   limits:
//     max_model_bytes: 512MiB
//     max_sealed_message_bytes: 64MiB
//     session_ttl_seconds: 3900
//     max_sessions_per_tenant: 10000
//     upload_idle_timeout_seconds: 60  # an upload silent this long is ended; 1..3600
//     upload_timeout_seconds: 1800     # an upload still incomplete this long is ended; 1..86400
//   attestation_policies:
//     - name: production
//       file: ../attestation/sev-snp-h100.yaml
//   attestation_policy: production     # default for tenants that name none
//
// The file is read into that message by proto/yaml_message.h; daemon_config.cc keeps the checks
// across fields and the conversion into DaemonConfig. Errors are "FILE:LINE: field: what"
// (unknown or repeated keys and wrong types included), one line per mistake in line order: the
// loader reports every top-level section and every entry of tenants, devices and
// attestation_policies that is wrong, not only the first. Flags override the file. Thread-safe:
// pure functions.
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
    "[--enclave-binary PATH] [--tee sim|sev-snp|tdx] [--gpu sim|nvidia-cc|none] | "
    "cloisterd --check-config FILE [--skip-file-checks] | cloisterd --model-digest PATH";

// One configured tenant: its credential and its limits.
struct TenantConfig {
  std::string tenant_id;
  Bytes token_sha256;  // 32 bytes; empty: no token, admitted by its mtls_identities alone
  TenantLimits limits;
  std::vector<std::string> mtls_identities;  // empty: any client (or none) may act for it
  std::string attestation_policy;            // resolved: the tenant's, else the daemon default
};

struct TlsConfig {
  // Paths as resolved against the config file's folder. Empty cert_file: plaintext.
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  bool require_client_cert = false;
  bool enabled() const { return !cert_file.empty(); }
};

struct OperatorConfig {
  std::string listen = "127.0.0.1:7701";  // "unix:PATH" or HOST:PORT
  std::string metrics_listen;             // HOST:PORT; empty: derived from `listen`
  bool allow_remote = false;
  absl::Duration stats_interval = absl::Seconds(5);  // statistics probe of the workers
};

// One enclave worker and its device, with defaults filled in (DaemonConfig::Workers()).
struct DeviceConfig {
  std::string name;
  std::string gpu;        // sim, nvidia-cc, none; empty: the worker's default
  std::string executor;   // auto, cpu, cuda; empty: the worker's default (auto)
  std::string pcie_mode;  // driver, emulated, off; empty: the worker's default
  std::string pci_address;
  int run_threads = 0;  // 1..64; 0: the worker's default (CPU executor: hardware threads, <= 8)
};

// Limits of the tenant API that are not per tenant (ServiceOptions).
struct ApiLimits {
  uint64_t max_model_size = uint64_t{512} << 20;
  uint64_t max_sealed_message_size = uint64_t{64} << 20;
  absl::Duration session_ttl = absl::Minutes(65);
  int max_sessions_per_tenant = 10000;
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  absl::Duration upload_timeout = absl::Minutes(30);
};

struct AttestationPolicyConfig {
  std::string name;
  std::string file;  // resolved against the config file's folder
};

// An operator-published model (config `published_models`).
struct PublishedModelConfig {
  std::string name;
  std::string file;    // resolved against the config file's folder: ONNX, package or folder
  std::string digest;  // 64 lowercase hex digits
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
  TlsConfig tls;
  OperatorConfig operator_api;
  std::vector<DeviceConfig> devices;  // as written; empty: `workers` default workers
  ApiLimits limits;
  std::vector<AttestationPolicyConfig> attestation_policies;
  std::string attestation_policy;  // default policy name for tenants; empty: none
  std::vector<PublishedModelConfig> published_models;
  std::string source_file;         // the config file it came from; empty: defaults and flags
  // Fields set by command-line flags over the file ("listen", "data_dir", ...): a reload of
  // the file does not count them as changed.
  std::vector<std::string> flag_overrides;

  // The credentials of the configured tenants, for TenantRegistry.
  std::vector<TenantCredential> Credentials() const;
  // One entry per enclave worker: `devices`, or `workers` entries named worker0.. with the
  // daemon's gpu.
  std::vector<DeviceConfig> Workers() const;
};

// Whether loading also reads the files a config names (TLS material, attestation policies)
// and checks them: they exist, are readable, hold PEM blocks of the right kind, and the
// policies' tee and gpu match the daemon's. kSkip checks only the config file itself (for
// configs written for another machine).
enum class FileChecks { kRead, kSkip };

// Parses config text; `file_name` is used in error messages and its folder resolves relative
// paths. Empty text gives defaults.
absl::StatusOr<DaemonConfig> ParseDaemonConfig(absl::string_view yaml_text,
                                               absl::string_view file_name,
                                               FileChecks file_checks = FileChecks::kSkip);
// One line for --check-config: tenants, workers, TLS, operator address.
std::string DescribeDaemonConfig(const DaemonConfig& config);

// Reads and parses a config file.
absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path,
                                              FileChecks file_checks = FileChecks::kRead);

struct CommandLine {
  std::optional<std::string> config_path;
  std::optional<std::string> listen;
  std::optional<std::string> data_dir;
  std::optional<std::string> enclave_binary;
  std::optional<std::string> tee;
  std::optional<std::string> gpu;
  std::optional<std::string> check_config;  // --check-config FILE: validate, then exit
  bool skip_file_checks = false;            // --skip-file-checks, with --check-config only
  // --model-digest PATH: print the digest a published_models entry for PATH needs, then exit.
  std::optional<std::string> model_digest;
  bool help = false;
};

// Parses `--flag VALUE` and `--flag=VALUE` forms (and the boolean --skip-file-checks).
// InvalidArgument with a one-line message for an unknown flag, a missing value or a stray argument.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

// The effective settings: the config file (if any) with the flags applied on top, validated.
absl::StatusOr<DaemonConfig> ResolveDaemonConfig(const CommandLine& command_line);

// The TEE and GPU choices together: each a known word, a simulated GPU only with a simulated
// TEE, a real NVIDIA GPU only with a real TEE. InvalidArgument with one line otherwise.
absl::Status CheckEvidenceSources(absl::string_view tee, absl::string_view gpu);

// The file at `path` holds at least one PEM block of `kind` ("CERTIFICATE"; "PRIVATE KEY" also
// accepts "RSA PRIVATE KEY" and "EC PRIVATE KEY"). The read error, or InvalidArgument naming
// the file.
absl::Status CheckPemFile(const std::string& path, absl::string_view kind);

// HOST:PORT with a port in 0..65535 (an IPv6 host in brackets). InvalidArgument otherwise.
absl::Status CheckListenAddress(absl::string_view listen);
// "unix:PATH", or a HOST:PORT that is loopback (127.0.0.0/8, [::1], localhost) unless
// `allow_remote`. InvalidArgument otherwise.
absl::Status CheckOperatorAddress(absl::string_view listen, bool allow_remote);
// The HOST part of a valid HOST:PORT.
std::string ListenHost(absl::string_view listen);

}  // namespace cloister::host
