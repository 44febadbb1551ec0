// ConfigReloader: applies a changed config file to a running cloisterd without a restart
// (SIGHUP, or the operator RPC through ReloadConfig()).
//
// What reloads: the tenant set and each tenant's credential (token hash), its client-certificate
// identities, its attestation policy, and the attestation_policies table. These are swapped in
// as immutable snapshots: a call that already passed authentication finishes under the
// snapshot it started with, and every later call sees the new one. The tenant registry and the
// identity check are two snapshots swapped one after the other (identities first), so for a
// moment a call may see the new identities with the old tokens; each is a complete, valid set.
//
// What does not: everything else (addresses, TLS files' names, workers, devices, scheduler and
// per-tenant limits, API limits, data dir). A changed value there is reported in
// ReloadOutcome::restart_needed and logged; the running value stays until a restart.
//
// A file that fails to load or check (FileChecks::kRead) is refused as a whole: nothing
// changes, the error is returned and logged (event config_reload_refused).
//
// Threading: ReloadConfig() and config() are safe from any thread; reloads are serialized.
// Ownership: the registry and identity check are borrowed and must outlive the reloader.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "host/config/daemon_config.h"
#include "host/config/tenant_tls.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {

struct ReloadOutcome {
  std::string file;  // the file that was applied
  int tenant_count = 0;
  std::vector<std::string> tenants_added;
  std::vector<std::string> tenants_removed;
  // Tenants whose token hash, identities or attestation policy changed.
  std::vector<std::string> tenants_changed;
  // Fields whose new value waits for a restart, e.g. "listen", "scheduler.max_batch_size",
  // "tenants.acme.limits".
  std::vector<std::string> restart_needed;
};

class ConfigReloader {
 public:
  struct Targets {
    TenantRegistry* registry = nullptr;  // required
    // The tenant port's mutual-TLS check; nullptr when the port has none.
    TenantIdentityCheck* identities = nullptr;
    // The tenants to serve when a config lists none (the development tenant).
    std::vector<TenantCredential> development_tenants;
  };

  // `running` is the config the daemon started with (its source_file is the default file to
  // reload).
  ConfigReloader(DaemonConfig running, Targets targets);

  // Loads `path` (empty: the file the daemon started with) with FileChecks::kRead and applies
  // its reloadable part. FailedPrecondition when the daemon started without a config file and
  // `path` is empty; the loader's InvalidArgument (every mistake, FILE:LINE: field: what) for
  // a bad file, with nothing changed. Logs config_reloaded or config_reload_refused.
  absl::StatusOr<ReloadOutcome> ReloadConfig(const std::string& path = "");

  // The config now in force: the last applied file's reloadable fields; the other fields as
  // they were at start-up.
  std::shared_ptr<const DaemonConfig> config() const { return current_.load(); }

 private:
  absl::StatusOr<ReloadOutcome> Apply(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DaemonConfig started_;
  const Targets targets_;
  absl::Mutex mu_;  // serializes reloads
  std::atomic<std::shared_ptr<const DaemonConfig>> current_;
};

// The settings that only a restart changes, as "field=value" strings in a fixed order; two
// configs need no restart between them when these are equal.
std::vector<std::pair<std::string, std::string>> RestartOnlySettings(const DaemonConfig& config);

}  // namespace cloister::host
