#include "host/config/daemon_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "cloister/config/v1/daemon.pb.h"
#include "host/common/ids.h"
#include "proto/yaml_message.h"
#include "yaml-cpp/yaml.h"

namespace cloister::host {
namespace {

namespace v1 = ::cloister::config::v1;
using ::cloister::proto::YamlMessageReader;

// What the schema alone cannot say: the config's wording, `tenants` limits written beside the
// tenant's other keys, the old name of `scheduler`, sizes with binary suffixes and the accepted
// range of each number.
proto::YamlReadOptions ReadOptions() {
  proto::YamlReadOptions options;
  options.wording = proto::YamlWording::kConfig;
  options.keep_going = true;
  options.byte_suffixes = true;
  options.inline_fields = {"cloister.config.v1.Tenant.limits"};
  options.aliases = {{"cloister.config.v1.Daemon.batching", "scheduler"}};
  const std::string v1 = "cloister.config.v1.";
  for (const auto& [field, min, max] :
       std::initializer_list<std::tuple<const char*, double, double>>{
           {"Daemon.workers", 1, 64},
           {"Scheduler.max_batch_size", 1, 1024},
           {"Scheduler.preferred_batch_sizes", 1, 1024},
           {"Scheduler.max_queue_delay_ms", 0, 10000},
           {"Scheduler.max_batches_in_flight", 1, 64},
           {"Scheduler.best_effort_max_batch_size", 1, 1024},
           {"Scheduler.best_effort_max_batch_time_ms", 0.001, 60000},
           {"Scheduler.realtime_activity_window_ms", 0, 60000},
           {"Scheduler.realtime_arrival_guard_ms", 0, 1000},
           {"Scheduler.realtime_reserved_slots", 0, 63},
           {"Scheduler.fairness_quantum_ms", 0.001, 60000},
           {"TenantLimits.weight", 1, 10000},
           {"TenantLimits.rate_per_second", 0, 1e9},
           {"TenantLimits.burst", 0, 1e9},
           {"TenantLimits.max_queued_requests", 1, 1 << 24},
           {"TenantLimits.default_deadline_ms", 0, 3.6e6},
           {"TenantLimits.max_deadline_ms", 0, 3.6e6},
           {"TenantLimits.max_generations", 1, 1 << 20},
           {"TenantLimits.tokens_per_second", 0, 1e12},
           {"TenantLimits.token_burst", 0, 1e15},
           {"Device.run_threads", 1, 64},
           {"Limits.session_ttl_seconds", 60, 86400},
           {"Limits.max_sessions_per_tenant", 1, 1000000},
           {"Limits.upload_idle_timeout_seconds", 1, 3600},
           {"Limits.upload_timeout_seconds", 1, 86400},
           {"Operator.stats_interval_seconds", 0.1, 3600},
       }) {
    options.ranges[v1 + field] = {min, max};
  }
  return options;
}

// The YAML word of an enum value, "" for unspecified.
std::string Word(const google::protobuf::EnumDescriptor* type, int value) {
  return value == 0 ? "" : proto::EnumYamlName(*type->FindValueByNumber(value));
}

absl::Duration Milliseconds(double ms) {
  return absl::Microseconds(static_cast<int64_t>(ms * 1000));
}
absl::Duration Seconds(double s) { return absl::Milliseconds(static_cast<int64_t>(s * 1000)); }

// One load: the reader (with the line of every field) and the errors found beyond the schema.
class Loader {
 public:
  explicit Loader(absl::string_view file_name)
      : reader_(file_name, ReadOptions()),
        base_dir_(std::filesystem::path(std::string(file_name)).parent_path().string()) {}

  YamlMessageReader& reader() { return reader_; }
  // "FILE:LINE: PATH: what" at the value of `at` (or the closest enclosing value written).
  absl::Status At(absl::string_view at, absl::string_view path, absl::string_view what) const {
    return reader_.ErrorAt(reader_.ValueMark(at), path, what);
  }
  absl::Status At(absl::string_view path, absl::string_view what) const {
    return At(path, path, what);
  }
  void Add(absl::Status status) {
    if (!status.ok()) errors_.push_back(std::move(status));
  }
  bool ok() const { return reader_.errors().empty() && errors_.empty(); }
  // Every error, by line (stable: the reader's first), one per line.
  absl::Status Errors() const {
    std::vector<absl::Status> all = reader_.errors();
    all.insert(all.end(), errors_.begin(), errors_.end());
    std::stable_sort(all.begin(), all.end(), [](const absl::Status& a, const absl::Status& b) {
      return proto::ErrorLine(a) < proto::ErrorLine(b);
    });
    std::vector<std::string> lines;
    for (const absl::Status& status : all) lines.emplace_back(status.message());
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }
  // `path` as seen from the process: relative paths are relative to the config's folder.
  std::string Resolve(const std::string& path) const {
    if (path.empty() || path[0] == '/' || base_dir_.empty()) return path;
    return (std::filesystem::path(base_dir_) / path).lexically_normal().string();
  }
  // [a-z0-9_-]{1,max_length}
  absl::Status CheckName(const std::string& path, const std::string& name,
                         size_t max_length) const {
    bool valid = name.size() <= max_length;
    for (char c : name) {
      valid = valid && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
    }
    if (valid) return absl::OkStatus();
    return At(path, absl::StrCat("'", name, "' is not a name: use a-z, 0-9, _ and -, at most ",
                                 max_length, " characters"));
  }

 private:
  YamlMessageReader reader_;
  std::string base_dir_;
  std::vector<absl::Status> errors_;
};

// Sets the limits written in `written` (under `prefix`, "tenant_defaults" or "tenants[N]")
// over `limits`.
absl::Status ApplyLimits(const Loader& loader, const v1::TenantLimits& written,
                         const std::string& prefix, TenantLimits& limits) {
  auto path = [&](absl::string_view name) { return absl::StrCat(prefix, ".", name); };
  switch (written.priority()) {
    case v1::PRIORITY_CLASS_REALTIME:
      limits.priority = PriorityClass::kRealtime;
      break;
    case v1::PRIORITY_CLASS_STANDARD:
      limits.priority = PriorityClass::kStandard;
      break;
    case v1::PRIORITY_CLASS_BATCH:
      limits.priority = PriorityClass::kBatch;
      break;
    default:
      break;
  }
  if (written.has_weight()) limits.weight = static_cast<int>(written.weight());
  if (written.has_rate_per_second()) limits.rate_per_second = written.rate_per_second();
  if (written.has_burst()) limits.burst = written.burst();
  if (written.has_max_queued_requests()) {
    limits.max_queued_requests = static_cast<int>(written.max_queued_requests());
  }
  if (written.has_max_generations()) {
    limits.max_generations = static_cast<int>(written.max_generations());
  }
  if (written.has_max_tokens()) limits.max_tokens = written.max_tokens();
  if (written.has_kv_cache_tokens()) limits.kv_cache_tokens = written.kv_cache_tokens();
  if (written.has_tokens_per_second()) limits.tokens_per_second = written.tokens_per_second();
  if (written.has_token_burst()) limits.token_burst = written.token_burst();
  for (const auto& [has, value, name, target] :
       {std::tuple{written.has_max_queued_bytes(), written.max_queued_bytes(), "max_queued_bytes",
                   &limits.max_queued_size},
        std::tuple{written.has_max_payload_bytes(), written.max_payload_bytes(),
                   "max_payload_bytes", &limits.max_payload_size},
        std::tuple{written.has_model_memory_quota_bytes(), written.model_memory_quota_bytes(),
                   "model_memory_quota_bytes", &limits.model_memory_quota}}) {
    if (!has) continue;
    if (value == 0) return loader.At(path(name), "must be at least 1 byte");
    *target = value;
  }
  for (const auto& [has, ms, name, target] :
       {std::tuple{written.has_default_deadline_ms(), written.default_deadline_ms(),
                   "default_deadline_ms", &limits.default_deadline},
        std::tuple{written.has_max_deadline_ms(), written.max_deadline_ms(), "max_deadline_ms",
                   &limits.max_deadline}}) {
    if (!has) continue;
    *target = ms == 0 ? absl::InfiniteDuration() : Milliseconds(ms);
    if (*target == absl::ZeroDuration()) {
      return loader.At(path(name), "must be 0 (none) or at least 0.001");
    }
  }
  return absl::OkStatus();
}

// `section` is the key the map was written under: scheduler, or its older name batching.
absl::Status ApplyScheduler(const Loader& loader, const v1::Scheduler& written,
                            const std::string& section, SchedulerOptions& options) {
  if (written.has_max_batch_size()) options.max_batch_size = written.max_batch_size();
  if (written.preferred_batch_sizes_size() > 0) {
    options.preferred_batch_sizes.clear();
    for (int i = 0; i < written.preferred_batch_sizes_size(); ++i) {
      const int size = static_cast<int>(written.preferred_batch_sizes(i));
      if (i > 0 && size <= options.preferred_batch_sizes.back()) {
        return loader.At(absl::StrCat(section, ".preferred_batch_sizes[", i, "]"),
                         "sizes must be in ascending order");
      }
      options.preferred_batch_sizes.push_back(size);
    }
  }
  for (const auto& [has, value, target] :
       {std::tuple{written.has_max_batches_in_flight(), written.max_batches_in_flight(),
                   &options.max_batches_in_flight},
        std::tuple{written.has_best_effort_max_batch_size(), written.best_effort_max_batch_size(),
                   &options.best_effort_max_batch_size},
        std::tuple{written.has_realtime_reserved_slots(), written.realtime_reserved_slots(),
                   &options.realtime_reserved_slots}}) {
    if (has) *target = static_cast<int>(value);
  }
  for (const auto& [has, ms, target] :
       {std::tuple{written.has_max_queue_delay_ms(), written.max_queue_delay_ms(),
                   &options.max_queue_delay},
        std::tuple{written.has_best_effort_max_batch_time_ms(),
                   written.best_effort_max_batch_time_ms(), &options.best_effort_max_batch_time},
        std::tuple{written.has_realtime_activity_window_ms(), written.realtime_activity_window_ms(),
                   &options.realtime_activity_window},
        std::tuple{written.has_realtime_arrival_guard_ms(), written.realtime_arrival_guard_ms(),
                   &options.realtime_arrival_guard},
        std::tuple{written.has_fairness_quantum_ms(), written.fairness_quantum_ms(),
                   &options.fairness_quantum}}) {
    if (has) *target = Milliseconds(ms);
  }
  if (written.has_adaptive_queue_delay()) {
    options.adaptive_queue_delay = written.adaptive_queue_delay();
  }
  if (written.has_best_effort_max_batch_size() &&
      options.best_effort_max_batch_size > options.max_batch_size) {
    return loader.At(
        section, absl::StrCat("best_effort_max_batch_size (", options.best_effort_max_batch_size,
                              ") is larger than max_batch_size (", options.max_batch_size, ")"));
  }
  if (options.realtime_reserved_slots >= options.max_batches_in_flight &&
      options.realtime_reserved_slots > 0) {
    return loader.At(section,
                     absl::StrCat("realtime_reserved_slots (", options.realtime_reserved_slots,
                                  ") must be less than max_batches_in_flight (",
                                  options.max_batches_in_flight, ")"));
  }
  if (!options.preferred_batch_sizes.empty() &&
      options.preferred_batch_sizes.back() > options.max_batch_size) {
    return loader.At(section,
                     absl::StrCat("preferred batch size ", options.preferred_batch_sizes.back(),
                                  " is larger than max_batch_size (", options.max_batch_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ConvertTls(Loader& loader, const v1::Tls& written, TlsConfig& tls) {
  tls.cert_file = loader.Resolve(written.cert_file());
  tls.key_file = loader.Resolve(written.key_file());
  tls.client_ca_file = loader.Resolve(written.client_ca_file());
  tls.require_client_cert = written.require_client_cert();
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return loader.At("tls", tls.cert_file.empty() ? "tls.cert_file" : "tls.key_file",
                     "missing: cert_file and key_file go together");
  }
  if (tls.cert_file.empty()) {
    return loader.At("tls", "tls.cert_file", "missing: a tls section needs cert_file and key_file");
  }
  if (tls.require_client_cert && tls.client_ca_file.empty()) {
    return loader.At("tls", "tls.require_client_cert",
                     "needs tls.client_ca_file (the CA that issues client certificates)");
  }
  return absl::OkStatus();
}

absl::Status ConvertOperator(const Loader& loader, const v1::Operator& written,
                             OperatorConfig& operator_api) {
  if (!written.listen().empty()) operator_api.listen = written.listen();
  operator_api.metrics_listen = written.metrics_listen();
  operator_api.allow_remote = written.allow_remote();
  if (written.has_stats_interval_seconds()) {
    operator_api.stats_interval = Seconds(written.stats_interval_seconds());
  }
  absl::Status valid = CheckOperatorAddress(operator_api.listen, operator_api.allow_remote);
  if (!valid.ok()) return loader.At("operator.listen", valid.message());
  if (operator_api.metrics_listen.empty()) return absl::OkStatus();
  absl::Status metrics_valid =
      absl::StartsWith(operator_api.metrics_listen, "unix:")
          ? absl::InvalidArgumentError(
                "the metrics endpoint is HTTP on HOST:PORT, not a unix socket")
          : CheckOperatorAddress(operator_api.metrics_listen, operator_api.allow_remote);
  if (!metrics_valid.ok()) return loader.At("operator.metrics_listen", metrics_valid.message());
  return absl::OkStatus();
}

// One entry of `devices`, checked on its own and against the ones before it.
absl::Status ConvertDevice(Loader& loader, const v1::Device& written, const std::string& where,
                           const std::vector<DeviceConfig>& before, DeviceConfig& device) {
  device.name = written.name();
  device.gpu = Word(v1::Gpu_descriptor(), written.gpu());
  device.executor = Word(v1::Executor_descriptor(), written.executor());
  device.pcie_mode = Word(v1::PcieMode_descriptor(), written.pcie_mode());
  device.pci_address = written.pci_address();
  device.run_threads = static_cast<int>(written.run_threads());
  if (!device.name.empty()) RETURN_IF_ERROR(loader.CheckName(where + ".name", device.name, 32));
  // DDDD:BB:DD.F in hex.
  const std::string& address = device.pci_address;
  if (!address.empty()) {
    bool valid =
        address.size() == 12 && address[4] == ':' && address[7] == ':' && address[10] == '.';
    for (size_t i = 0; valid && i < address.size(); ++i) {
      if (i == 4 || i == 7 || i == 10) continue;
      valid = absl::ascii_isxdigit(static_cast<unsigned char>(address[i]));
    }
    if (!valid) {
      return loader.At(where + ".pci_address",
                       absl::StrCat("'", address, "' is not a PCI address like 0000:c1:00.0"));
    }
  }
  if (device.name.empty()) return loader.At(where, "missing field 'name'");
  if (device.gpu == "nvidia-cc" && device.pcie_mode == "off") {
    return loader.At(where + ".pcie_mode",
                     "off (plaintext on the bus) cannot be used with gpu nvidia-cc");
  }
  if (device.executor == "cuda" && (device.gpu == "sim" || device.gpu == "none")) {
    return loader.At(where + ".executor",
                     absl::StrCat("cuda needs a GPU; this device has gpu ", device.gpu));
  }
  if (device.executor == "cuda" && device.run_threads > 0) {
    return loader.At(where + ".run_threads",
                     "applies to the CPU executor only; this device has executor cuda");
  }
  for (const DeviceConfig& other : before) {
    if (other.name == device.name) {
      return loader.At(where, where + ".name",
                       absl::StrCat("device '", device.name, "' is listed twice"));
    }
    if (!device.pci_address.empty() && other.pci_address == device.pci_address) {
      return loader.At(where, where + ".pci_address",
                       absl::StrCat(device.pci_address, " is already device '", other.name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertApiLimits(const Loader& loader, const v1::Limits& written, ApiLimits& limits) {
  for (const auto& [has, value, name, target] :
       {std::tuple{written.has_max_model_bytes(), written.max_model_bytes(), "max_model_bytes",
                   &limits.max_model_size},
        std::tuple{written.has_max_sealed_message_bytes(), written.max_sealed_message_bytes(),
                   "max_sealed_message_bytes", &limits.max_sealed_message_size}}) {
    if (!has) continue;
    if (value == 0) return loader.At(absl::StrCat("limits.", name), "must be at least 1 byte");
    *target = value;
  }
  if (limits.max_sealed_message_size > (uint64_t{1} << 30)) {
    return loader.At("limits.max_sealed_message_bytes", "must be at most 1GiB (one gRPC message)");
  }
  if (written.has_session_ttl_seconds())
    limits.session_ttl = Seconds(written.session_ttl_seconds());
  if (written.has_max_sessions_per_tenant()) {
    limits.max_sessions_per_tenant = static_cast<int>(written.max_sessions_per_tenant());
  }
  if (written.has_upload_idle_timeout_seconds()) {
    limits.upload_idle_timeout = Seconds(written.upload_idle_timeout_seconds());
  }
  if (written.has_upload_timeout_seconds()) {
    limits.upload_timeout = Seconds(written.upload_timeout_seconds());
  }
  return absl::OkStatus();
}

absl::Status ConvertPolicyRef(Loader& loader, const v1::AttestationPolicyRef& written,
                              const std::string& where,
                              const std::vector<AttestationPolicyConfig>& before,
                              AttestationPolicyConfig& policy) {
  policy.name = written.name();
  policy.file = loader.Resolve(written.file());
  if (!policy.name.empty()) RETURN_IF_ERROR(loader.CheckName(where + ".name", policy.name, 64));
  if (policy.name.empty()) return loader.At(where, "missing field 'name'");
  if (policy.file.empty()) return loader.At(where, "missing field 'file'");
  for (const AttestationPolicyConfig& other : before) {
    if (other.name == policy.name) {
      return loader.At(where, where + ".name",
                       absl::StrCat("policy '", policy.name, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

// One tenant over tenant_defaults, its references checked against attestation_policies and tls.
absl::Status ConvertTenant(Loader& loader, const v1::Tenant& written, const std::string& where,
                           const DaemonConfig& config, TenantConfig& tenant) {
  tenant.tenant_id = written.id();
  if (!tenant.tenant_id.empty() && !IsValidTenantId(tenant.tenant_id)) {
    return loader.At(where + ".id", CheckTenantId(tenant.tenant_id).message());
  }
  if (!written.token_sha256().empty()) {
    absl::StatusOr<Bytes> hash = HexDecode(written.token_sha256());
    if (!hash.ok() || hash->size() != 32) {
      return loader.At(where + ".token_sha256",
                       "expected 64 hex digits (the SHA-256 of the tenant's API token)");
    }
    tenant.token_sha256 = *std::move(hash);
  }
  for (int i = 0; i < written.mtls_identities_size(); ++i) {
    const std::string& identity = written.mtls_identities(i);
    if (identity.size() > 512 || identity.find_first_of(" \t\r\n") != std::string::npos) {
      return loader.At(absl::StrCat(where, ".mtls_identities[", i, "]"),
                       "an identity is a certificate name or SAN without spaces, at most 512 "
                       "characters");
    }
    tenant.mtls_identities.push_back(identity);
  }
  tenant.attestation_policy = written.attestation_policy();
  const std::string policy_path = where + ".attestation_policy";
  if (!tenant.attestation_policy.empty()) {
    RETURN_IF_ERROR(loader.CheckName(policy_path, tenant.attestation_policy, 64));
  }
  tenant.limits = config.scheduler.default_limits;
  RETURN_IF_ERROR(ApplyLimits(loader, written.limits(), where, tenant.limits));
  if (tenant.tenant_id.empty()) return loader.At(where, "missing field 'id'");
  // A tenant bound to client certificates may go without a token (admitted by mutual TLS alone).
  if (tenant.token_sha256.empty() && tenant.mtls_identities.empty()) {
    return loader.At(where, "missing field 'token_sha256' (or mtls_identities)");
  }
  for (const TenantConfig& other : config.tenants) {
    if (other.tenant_id == tenant.tenant_id) {
      return loader.At(where, where + ".id",
                       absl::StrCat("tenant '", tenant.tenant_id, "' is listed twice"));
    }
  }
  if (!tenant.attestation_policy.empty()) {
    bool known = false;
    for (const AttestationPolicyConfig& policy : config.attestation_policies) {
      known = known || policy.name == tenant.attestation_policy;
    }
    if (!known) {
      return loader.At(policy_path,
                       absl::StrCat("no attestation policy named '", tenant.attestation_policy,
                                    "' in attestation_policies"));
    }
  }
  // (A tls section that was refused has its own error.)
  if (!tenant.mtls_identities.empty() && config.tls.client_ca_file.empty() &&
      !loader.reader().Failed("tls")) {
    return loader.At(where + ".mtls_identities",
                     "client identities need tls.client_ca_file (mutual TLS)");
  }
  if (tenant.attestation_policy.empty()) tenant.attestation_policy = config.attestation_policy;
  return absl::OkStatus();
}

// The daemon's settings from the message read, section by section; a section the reader
// refused is left at its defaults (its error is already reported).
void Convert(Loader& loader, const v1::Daemon& daemon, DaemonConfig& config) {
  const YamlMessageReader& reader = loader.reader();
  auto usable = [&](absl::string_view section) {
    return reader.Written(section) && !reader.Failed(section);
  };
  if (usable("listen")) {
    config.listen = daemon.listen();
    absl::Status valid = CheckListenAddress(config.listen);
    if (!valid.ok()) loader.Add(loader.At("listen", valid.message()));
  }
  if (usable("data_dir")) config.data_dir = daemon.data_dir();
  if (usable("enclave_binary")) config.enclave_binary = daemon.enclave_binary();
  if (usable("tee")) config.tee = Word(v1::Tee_descriptor(), daemon.tee());
  if (usable("gpu")) config.gpu = Word(v1::Gpu_descriptor(), daemon.gpu());
  if (usable("workers")) config.workers = static_cast<int>(daemon.workers());
  const std::string scheduler = reader.Written("batching") ? "batching" : "scheduler";
  if (usable(scheduler)) {
    loader.Add(ApplyScheduler(loader, daemon.scheduler(), scheduler, config.scheduler));
  }
  if (usable("tenant_defaults")) {
    loader.Add(ApplyLimits(loader, daemon.tenant_defaults(), "tenant_defaults",
                           config.scheduler.default_limits));
  }
  if (usable("tls")) loader.Add(ConvertTls(loader, daemon.tls(), config.tls));
  if (usable("operator"))
    loader.Add(ConvertOperator(loader, daemon.operator_(), config.operator_api));
  bool devices_ok = usable("devices");
  if (devices_ok && daemon.devices_size() == 0) {
    loader.Add(loader.At("devices", "must list at least one device"));
    devices_ok = false;
  } else if (devices_ok && daemon.devices_size() > 64) {
    loader.Add(loader.At("devices", "at most 64 devices"));
    devices_ok = false;
  }
  for (int i = 0; devices_ok && i < daemon.devices_size(); ++i) {
    DeviceConfig device;
    absl::Status status = ConvertDevice(loader, daemon.devices(i), absl::StrCat("devices[", i, "]"),
                                        config.devices, device);
    loader.Add(status);
    devices_ok = status.ok();
    config.devices.push_back(std::move(device));
  }
  if (!devices_ok) config.devices.clear();
  if (usable("limits")) loader.Add(ConvertApiLimits(loader, daemon.limits(), config.limits));
  for (int i = 0; i < daemon.attestation_policies_size(); ++i) {
    const std::string where = absl::StrCat("attestation_policies[", i, "]");
    if (reader.Failed(where)) continue;
    AttestationPolicyConfig policy;
    absl::Status status = ConvertPolicyRef(loader, daemon.attestation_policies(i), where,
                                           config.attestation_policies, policy);
    if (status.ok()) config.attestation_policies.push_back(std::move(policy));
    loader.Add(status);
  }
  if (usable("attestation_policy")) {
    config.attestation_policy = daemon.attestation_policy();
    absl::Status status = loader.CheckName("attestation_policy", config.attestation_policy, 64);
    bool known = false;
    for (const AttestationPolicyConfig& policy : config.attestation_policies) {
      known = known || policy.name == config.attestation_policy;
    }
    if (status.ok() && !known) {
      status = loader.At("attestation_policy",
                         absl::StrCat("no attestation policy named '", config.attestation_policy,
                                      "' in attestation_policies"));
    }
    loader.Add(status);
  }
  std::set<std::string> published_names;
  for (int i = 0; i < daemon.published_models_size(); ++i) {
    const std::string where = absl::StrCat("published_models[", i, "]");
    if (reader.Failed(where)) continue;
    const v1::PublishedModel& entry = daemon.published_models(i);
    PublishedModelConfig model;
    model.name = entry.name();
    model.file = loader.Resolve(entry.file());
    model.digest = absl::AsciiStrToLower(entry.digest());
    bool ok = true;
    auto fail = [&](const std::string& field, const std::string& what) {
      loader.Add(loader.At(absl::StrCat(where, ".", field), what));
      ok = false;
    };
    if (model.name.empty() || model.name.size() > 128 ||
        model.name.find_first_not_of(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
            std::string::npos) {
      fail("name", absl::StrCat("'", model.name,
                                "' is not a model name: use A-Z, a-z, 0-9, ., _ and -, at most "
                                "128 characters"));
    } else if (!published_names.insert(model.name).second) {
      fail("name", absl::StrCat("'", model.name, "' is published twice"));
    }
    if (entry.file().empty()) fail("file", "missing (an ONNX file, a model package or a folder)");
    absl::StatusOr<Bytes> digest = HexDecode(model.digest);
    if (!digest.ok() || digest->size() != 32) {
      fail("digest", absl::StrCat("expected 64 hex digits (the SHA-256 of the model), got '",
                                  entry.digest(), "'"));
    }
    if (ok) config.published_models.push_back(std::move(model));
  }
  for (int i = 0; i < daemon.tenants_size(); ++i) {
    const std::string where = absl::StrCat("tenants[", i, "]");
    if (reader.Failed(where)) continue;
    TenantConfig tenant;
    absl::Status status = ConvertTenant(loader, daemon.tenants(i), where, config, tenant);
    loader.Add(status);
    if (!status.ok()) continue;
    config.scheduler.tenant_limits[tenant.tenant_id] = tenant.limits;
    config.tenants.push_back(std::move(tenant));
  }
  // The evidence pair, once both words are known and neither was refused; reported at the
  // later of the two.
  if (!reader.Failed("tee") && !reader.Failed("gpu")) {
    if (absl::Status valid = CheckEvidenceSources(config.tee, config.gpu); !valid.ok()) {
      const bool at_gpu =
          reader.Written("gpu") &&
          (!reader.Written("tee") || reader.ValueMark("gpu").pos > reader.ValueMark("tee").pos);
      loader.Add(loader.At(at_gpu ? "gpu" : "tee", valid.message()));
    }
  }
  if (!config.devices.empty()) {
    const int count = static_cast<int>(config.devices.size());
    if (usable("workers") && config.workers != count) {
      loader.Add(loader.At("workers", absl::StrCat(config.workers, " workers but ", count,
                                                   " devices: drop workers, devices decide")));
    }
    config.workers = count;
    for (int i = 0; i < count; ++i) {
      const std::string where = absl::StrCat("devices[", i, "]");
      if (config.devices[i].gpu.empty()) continue;
      if (absl::Status valid = CheckEvidenceSources(config.tee, config.devices[i].gpu);
          !valid.ok()) {
        loader.Add(loader.At(where, where + ".gpu", valid.message()));
      }
    }
  }
}

// The GPU evidence a worker reports when its gpu is left to the default.
std::string EffectiveGpu(absl::string_view tee, absl::string_view gpu) {
  if (!gpu.empty()) return std::string(gpu);
  return tee == "sim" ? "sim" : "none";
}

absl::Status CheckPemAt(const Loader& loader, const std::string& field, const std::string& path,
                        absl::string_view kind) {
  absl::Status status = CheckPemFile(path, kind);
  if (!status.ok()) return loader.At(field, status.message());
  return absl::OkStatus();
}

// The files the config names: TLS material and attestation policies (whose tee and gpu must
// match every worker's). Each problem is one error.
void CheckNamedFiles(Loader& loader, const DaemonConfig& config) {
  if (config.tls.enabled()) {
    loader.Add(CheckPemAt(loader, "tls.cert_file", config.tls.cert_file, "CERTIFICATE"));
    loader.Add(CheckPemAt(loader, "tls.key_file", config.tls.key_file, "PRIVATE KEY"));
    struct stat key_stat;
    if (::stat(config.tls.key_file.c_str(), &key_stat) == 0 && (key_stat.st_mode & 007) != 0) {
      loader.Add(loader.At(
          "tls.key_file",
          absl::StrCat(config.tls.key_file, " is readable by every user; chmod o-rwx it")));
    }
    if (!config.tls.client_ca_file.empty()) {
      loader.Add(
          CheckPemAt(loader, "tls.client_ca_file", config.tls.client_ca_file, "CERTIFICATE"));
    }
  }
  for (size_t i = 0; i < config.published_models.size(); ++i) {
    const std::string& file = config.published_models[i].file;
    std::error_code error;
    if (!std::filesystem::exists(file, error)) {
      loader.Add(loader.At(absl::StrCat("published_models[", i, "].file"),
                           absl::StrCat(file, " does not exist")));
    }
  }
  std::set<std::string> worker_gpus;
  for (const DeviceConfig& device : config.Workers()) {
    worker_gpus.insert(EffectiveGpu(config.tee, device.gpu));
  }
  for (size_t i = 0; i < config.attestation_policies.size(); ++i) {
    const AttestationPolicyConfig& policy = config.attestation_policies[i];
    const std::string field = absl::StrCat("attestation_policies[", i, "].file");
    absl::StatusOr<std::string> text = ReadFile(policy.file, 1 << 20);
    if (!text.ok()) {
      loader.Add(loader.At(field, text.status().message()));
      continue;
    }
    YAML::Node root;
    try {
      root = YAML::Load(*text);
    } catch (const YAML::Exception& e) {
      loader.Add(loader.At(
          field, absl::StrCat(policy.file, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg)));
      continue;
    }
    if (!root.IsMap()) {
      loader.Add(
          loader.At(field, absl::StrCat(policy.file, " is not an attestation policy (a map)")));
      continue;
    }
    const YAML::Node& policy_root = root;  // const: reading must not add keys
    for (absl::string_view key : {"tee", "gpu"}) {
      const YAML::Node value = policy_root[std::string(key)];
      if (!value.IsDefined() || !value.IsScalar()) continue;
      bool matches = key == "tee" ? value.Scalar() == config.tee
                                  : worker_gpus.size() == 1 && worker_gpus.contains(value.Scalar());
      if (!matches) {
        loader.Add(loader.At(
            field,
            absl::StrCat(policy.file, " is for ", key, " ", value.Scalar(), " but this daemon's ",
                         key == "tee" ? absl::StrCat("tee is ", config.tee)
                                      : absl::StrCat("workers report gpu ",
                                                     absl::StrJoin(worker_gpus, "/")))));
      }
    }
  }
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseDaemonConfig(absl::string_view yaml_text,
                                               absl::string_view file_name,
                                               FileChecks file_checks) {
  DaemonConfig config;
  config.source_file = std::string(file_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg));
  }
  if (root.IsNull() || !root.IsDefined()) return config;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ":", root.Mark().line + 1,
                                                   ": expected a map of settings, got ",
                                                   root.IsSequence() ? "a list" : "a scalar"));
  }
  Loader loader(file_name);
  try {
    // `tenants:` with nothing after it is the development tenant, like no `tenants` at all.
    const YAML::Node& read_only = root;  // const: looking must not add the key
    if (const YAML::Node tenants = read_only["tenants"]; tenants.IsDefined() && tenants.IsNull()) {
      root.remove("tenants");
    }
    v1::Daemon daemon;
    (void)loader.reader().ReadMessage(root, daemon);  // errors are kept in the reader
    Convert(loader, daemon, config);
  } catch (const YAML::Exception& e) {
    loader.Add(
        absl::InvalidArgumentError(absl::StrCat(file_name, ":", e.mark.line + 1, ": ", e.msg)));
  }
  if (loader.ok() && file_checks == FileChecks::kRead) CheckNamedFiles(loader, config);
  if (!loader.ok()) return loader.Errors();
  return config;
}

std::vector<DeviceConfig> DaemonConfig::Workers() const {
  if (!devices.empty()) {
    std::vector<DeviceConfig> workers_out = devices;
    for (DeviceConfig& device : workers_out) {
      if (device.gpu.empty()) device.gpu = gpu;
    }
    return workers_out;
  }
  std::vector<DeviceConfig> workers_out(workers);
  for (int index = 0; index < workers; ++index) {
    workers_out[index].name = absl::StrCat("worker", index);
    workers_out[index].gpu = gpu;
  }
  return workers_out;
}

std::string DescribeDaemonConfig(const DaemonConfig& config) {
  return absl::StrCat(
      config.tenants.empty()
          ? std::string("development tenant")
          : absl::StrCat(config.tenants.size(), " tenant", config.tenants.size() == 1 ? "" : "s"),
      ", ", config.Workers().size(), " worker", config.Workers().size() == 1 ? "" : "s", ", tee ",
      config.tee, ", listen ", config.listen,
      config.tls.enabled()
          ? (config.tls.client_ca_file.empty()
                 ? " with TLS"
                 : (config.tls.require_client_cert ? " with mutual TLS (required)"
                                                   : " with TLS, client certificates optional"))
          : " plaintext",
      ", operator ", config.operator_api.listen, ", ", config.attestation_policies.size(),
      " attestation polic", config.attestation_policies.size() == 1 ? "y" : "ies");
}

std::vector<TenantCredential> DaemonConfig::Credentials() const {
  std::vector<TenantCredential> credentials;
  for (const TenantConfig& tenant : tenants) {
    credentials.push_back({tenant.tenant_id, tenant.token_sha256});
  }
  return credentials;
}

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path, FileChecks file_checks) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read config: ", text.status().message()));
  }
  return ParseDaemonConfig(*text, path, file_checks);
}

}  // namespace cloister::host
