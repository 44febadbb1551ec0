#include "host/config/config_reloader.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/status.h"

namespace cloister::host {
namespace {

std::string Milliseconds(absl::Duration duration) {
  if (duration == absl::InfiniteDuration()) return "none";
  return absl::StrCat(absl::ToDoubleMilliseconds(duration));
}

std::string DescribeLimits(const TenantLimits& limits) {
  return absl::StrCat("priority=", PriorityClassName(limits.priority), " weight=", limits.weight,
                      " rate=", limits.rate_per_second, " burst=", limits.burst,
                      " queued=", limits.max_queued_requests,
                      " queued_size=", limits.max_queued_size, " payload=", limits.max_payload_size,
                      " quota=", limits.model_memory_quota,
                      " deadline_ms=", Milliseconds(limits.default_deadline),
                      " max_deadline_ms=", Milliseconds(limits.max_deadline));
}

std::string DescribeDevice(const DeviceConfig& device) {
  return absl::StrCat(device.name, "/", device.gpu, "/", device.executor, "/", device.pcie_mode,
                      "/", device.pci_address, "/", device.run_threads);
}

// What a tenant's entry contributes to the reloadable snapshot.
std::string DescribeCredential(const TenantConfig& tenant) {
  return absl::StrCat(HexEncode(tenant.token_sha256), " ",
                      absl::StrJoin(tenant.mtls_identities, ","), " ", tenant.attestation_policy);
}

std::vector<TenantCredential> CredentialsOrDevelopment(const DaemonConfig& config,
                                                       const std::vector<TenantCredential>& dev) {
  std::vector<TenantCredential> credentials = config.Credentials();
  if (credentials.empty()) credentials = dev;
  return credentials;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> RestartOnlySettings(const DaemonConfig& config) {
  std::vector<std::pair<std::string, std::string>> settings = {
      {"listen", config.listen},
      {"data_dir", config.data_dir},
      {"enclave_binary", config.enclave_binary},
      {"tee", config.tee},
      {"gpu", config.gpu},
      {"workers", absl::StrCat(config.workers)},
      {"tls.cert_file", config.tls.cert_file},
      {"tls.key_file", config.tls.key_file},
      {"tls.client_ca_file", config.tls.client_ca_file},
      {"tls.require_client_cert", config.tls.require_client_cert ? "true" : "false"},
      {"operator.listen", config.operator_api.listen},
      {"operator.metrics_listen", config.operator_api.metrics_listen},
      {"operator.allow_remote", config.operator_api.allow_remote ? "true" : "false"},
      {"operator.stats_interval_seconds",
       absl::StrCat(absl::ToDoubleSeconds(config.operator_api.stats_interval))},
      {"limits.max_model_bytes", absl::StrCat(config.limits.max_model_size)},
      {"limits.max_sealed_message_bytes", absl::StrCat(config.limits.max_sealed_message_size)},
      {"limits.session_ttl_seconds",
       absl::StrCat(absl::ToDoubleSeconds(config.limits.session_ttl))},
      {"limits.max_sessions_per_tenant", absl::StrCat(config.limits.max_sessions_per_tenant)},
      {"limits.upload_idle_timeout_seconds",
       absl::StrCat(absl::ToDoubleSeconds(config.limits.upload_idle_timeout))},
  };
  std::vector<std::string> published;
  for (const PublishedModelConfig& model : config.published_models) {
    published.push_back(absl::StrCat(model.name, "=", model.file, "@", model.digest));
  }
  settings.emplace_back("published_models", absl::StrJoin(published, " "));
  std::vector<std::string> devices;
  for (const DeviceConfig& device : config.devices) devices.push_back(DescribeDevice(device));
  settings.emplace_back("devices", absl::StrJoin(devices, " "));
  const SchedulerOptions& scheduler = config.scheduler;
  settings.insert(
      settings.end(),
      {{"scheduler.max_batch_size", absl::StrCat(scheduler.max_batch_size)},
       {"scheduler.preferred_batch_sizes", absl::StrJoin(scheduler.preferred_batch_sizes, ",")},
       {"scheduler.max_queue_delay_ms", Milliseconds(scheduler.max_queue_delay)},
       {"scheduler.max_batches_in_flight", absl::StrCat(scheduler.max_batches_in_flight)},
       {"scheduler.best_effort_max_batch_size", absl::StrCat(scheduler.best_effort_max_batch_size)},
       {"scheduler.best_effort_max_batch_time_ms",
        Milliseconds(scheduler.best_effort_max_batch_time)},
       {"scheduler.realtime_activity_window_ms", Milliseconds(scheduler.realtime_activity_window)},
       {"scheduler.fairness_quantum_ms", Milliseconds(scheduler.fairness_quantum)},
       {"tenant_defaults", DescribeLimits(scheduler.default_limits)}});
  // A tenant's effective limits: its own, or the defaults (what the scheduler applies to a
  // tenant it has no entry for).
  for (const auto& [tenant_id, limits] : scheduler.tenant_limits) {
    settings.emplace_back(absl::StrCat("tenants.", tenant_id, ".limits"), DescribeLimits(limits));
  }
  return settings;
}

ConfigReloader::ConfigReloader(DaemonConfig running, Targets targets)
    : started_(std::move(running)),
      targets_(std::move(targets)),
      current_(std::make_shared<const DaemonConfig>(started_)) {
  CLOISTER_CHECK(targets_.registry != nullptr);
}

absl::StatusOr<ReloadOutcome> ConfigReloader::ReloadConfig(const std::string& path) {
  absl::MutexLock lock(&mu_);
  std::string file = path.empty() ? started_.source_file : path;
  if (file.empty()) {
    absl::Status refused = absl::FailedPreconditionError(
        "cloisterd started without --config: there is no file to reload");
    Log(LogLevel::kWarning, "config_reload_refused", {{"error", refused.ToString()}});
    return refused;
  }
  absl::StatusOr<ReloadOutcome> outcome = Apply(file);
  if (!outcome.ok()) {
    Log(LogLevel::kError, "config_reload_refused",
        {{"file", file},
         {"error", std::string(outcome.status().message())},
         {"kept", "the running config stays in force"}});
    return outcome;
  }
  Log(LogLevel::kInfo, "config_reloaded",
      {{"file", file},
       {"tenants", outcome->tenant_count},
       {"added", absl::StrJoin(outcome->tenants_added, ",")},
       {"removed", absl::StrJoin(outcome->tenants_removed, ",")},
       {"changed", absl::StrJoin(outcome->tenants_changed, ",")}});
  if (!outcome->restart_needed.empty()) {
    Log(LogLevel::kWarning, "config_reload_needs_restart",
        {{"file", file}, {"fields", absl::StrJoin(outcome->restart_needed, ",")}});
  }
  return outcome;
}

absl::StatusOr<ReloadOutcome> ConfigReloader::Apply(const std::string& file) {
  ASSIGN_OR_RETURN(DaemonConfig loaded, LoadDaemonConfig(file, FileChecks::kRead));
  // The new file's tee and gpu decide whether its attestation policies fit; a reload cannot
  // change them, so they must match the running ones for the policy check to mean anything.
  if (loaded.tee != started_.tee) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tee: the running daemon uses tee ",
                                                   started_.tee, "; changing it needs a restart"));
  }

  // Client identities cannot be enforced on a port that started without a client CA: refuse
  // rather than report tenants as bound when they are not.
  if (targets_.identities == nullptr) {
    for (const TenantConfig& tenant : loaded.tenants) {
      if (!tenant.mtls_identities.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": tenants: ", tenant.tenant_id,
            " lists mtls_identities, but the running tenant port has no client CA; restart "
            "cloisterd to turn on mutual TLS"));
      }
    }
  }

  ReloadOutcome outcome;
  outcome.file = file;
  std::shared_ptr<const DaemonConfig> previous = current_.load();
  std::map<std::string, std::string> before;
  for (const TenantConfig& tenant : previous->tenants) {
    before[tenant.tenant_id] = DescribeCredential(tenant);
  }
  std::set<std::string> after;
  for (const TenantConfig& tenant : loaded.tenants) {
    after.insert(tenant.tenant_id);
    auto it = before.find(tenant.tenant_id);
    if (it == before.end()) {
      outcome.tenants_added.push_back(tenant.tenant_id);
    } else if (it->second != DescribeCredential(tenant)) {
      outcome.tenants_changed.push_back(tenant.tenant_id);
    }
  }
  for (const auto& [tenant_id, unused] : before) {
    if (!after.contains(tenant_id)) outcome.tenants_removed.push_back(tenant_id);
  }

  std::map<std::string, std::string> running_settings;
  for (auto& [field, value] : RestartOnlySettings(started_)) running_settings[field] = value;
  std::set<std::string> seen(started_.flag_overrides.begin(), started_.flag_overrides.end());
  for (auto& [field, value] : RestartOnlySettings(loaded)) {
    if (seen.contains(field)) continue;  // set by a flag: the file's value never applied
    seen.insert(field);
    auto it = running_settings.find(field);
    // A tenant without limits of its own runs under tenant_defaults, which is compared on its own.
    bool tenant_limits = absl::StartsWith(field, "tenants.");
    std::string running_value =
        it != running_settings.end()
            ? it->second
            : (tenant_limits ? DescribeLimits(started_.scheduler.default_limits) : "");
    if (running_value != value) outcome.restart_needed.push_back(field);
  }
  for (const auto& [field, value] : running_settings) {
    if (seen.contains(field)) continue;
    // A tenant dropped from the file: only its limits entry goes; nothing to restart for.
    if (!absl::StartsWith(field, "tenants.")) outcome.restart_needed.push_back(field);
  }

  // Build the new registry snapshot before touching anything, so a refusal changes nothing.
  std::vector<TenantCredential> credentials =
      CredentialsOrDevelopment(loaded, targets_.development_tenants);
  if (credentials.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file,
        ": tenants: lists no tenants; a running cloisterd keeps at least one (it started "
        "with configured tenants, so it has no development tenant to fall back to)"));
  }
  if (targets_.identities != nullptr) targets_.identities->Replace(loaded.tenants);
  if (absl::Status replaced = targets_.registry->Replace(std::move(credentials)); !replaced.ok()) {
    if (targets_.identities != nullptr) targets_.identities->Replace(previous->tenants);
    return replaced;
  }

  // The config in force: the file's reloadable fields over the start-up settings.
  auto current = std::make_shared<DaemonConfig>(started_);
  current->tenants = loaded.tenants;
  current->attestation_policies = loaded.attestation_policies;
  current->attestation_policy = loaded.attestation_policy;
  current->source_file = file;
  current_.store(std::move(current));
  outcome.tenant_count = static_cast<int>(loaded.tenants.size());
  return outcome;
}

}  // namespace cloister::host
