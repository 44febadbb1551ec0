// OperatorPlane: everything cloisterd does for its operator, in one place so the daemon's main
// only wires it in: the audit log (DATA_DIR/audit/audit.jsonl) and its periodic enclave-signed
// checkpoints, the metrics and their /metrics HTTP endpoint, the evidence tracker and its
// periodic probe of every worker, the periodic statistics probe of every worker (model memory
// per tenant, device memory; GetStatsCall), the operator gRPC service (Status, Reload), and the
// audit entries for start, stop and config reloads.
//
// Order of use: Create (before the scheduler and the tenant service exist) -> the hooks
// (SchedulerHooks, ServiceHooks, TenantApiInterceptors, ObserveStartupEvidence) -> Start (with
// the scheduler, service and blob store) -> Reload any number of times -> Stop.
//
// Threading: Reload, Stop and the accessors are thread-safe. A background thread signs
// checkpoints and probes evidence; it calls the enclave workers and waits for them (never on a
// gRPC thread). Ownership: owns the audit log, metrics, servers and thread; borrows the workers,
// the reloader and (after Start) the scheduler, service and blob store, which must outlive it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "host/audit/audit_log.h"
#include "host/config/config_reloader.h"
#include "host/enclave_client/enclave_client.h"
#include "host/metrics/metrics.h"
#include "host/operator/operator_service.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/storage/blob_store.h"

namespace cloister::host {

struct OperatorPlaneOptions {
  std::string data_dir;         // the audit log goes to DATA_DIR/audit/audit.jsonl
  std::string operator_listen;  // "unix:PATH" or HOST:PORT
  std::string metrics_listen;   // HOST:PORT; empty: MetricsAddressFor(operator_listen)
  // Per worker: its TEE and GPU evidence sources, in worker order.
  std::vector<std::pair<std::string, std::string>> worker_kinds;
  absl::Duration checkpoint_interval = absl::Minutes(1);
  absl::Duration evidence_probe_interval = absl::Minutes(1);
  // How often each worker is asked for its memory statistics (also once right after Start).
  absl::Duration stats_probe_interval = absl::Seconds(5);
  absl::Duration enclave_call_timeout = absl::Seconds(30);
};

class OperatorPlane {
 public:
  // Opens the audit log (its errors: a torn or unreadable log stops start-up) and records
  // daemon_started. `reloader` may be nullptr (Reload then answers UNIMPLEMENTED).
  static absl::StatusOr<std::unique_ptr<OperatorPlane>> Create(OperatorPlaneOptions options,
                                                               std::vector<EnclaveClient*> workers,
                                                               ConfigReloader* reloader);
  ~OperatorPlane();  // Stop()
  OperatorPlane(const OperatorPlane&) = delete;
  OperatorPlane& operator=(const OperatorPlane&) = delete;

  AuditLog* audit() { return audit_.get(); }
  Metrics* metrics() { return &metrics_; }
  EvidenceTracker* evidence() { return &evidence_; }

  // Adds the batch metrics hook to the scheduler's options (keeps any hook already there).
  void InstallSchedulerHooks(SchedulerOptions& options);
  // Adds the audit log and the evidence hook to the tenant service's options.
  void InstallServiceHooks(ServiceOptions& options);
  // For StartGrpcServer of the tenant API: counts every call.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  TenantApiInterceptors();
  // The evidence each worker gave at start-up.
  void ObserveStartupEvidence(int worker, const boundary::v1::GetEvidenceResult& evidence);
  // Counts a verified usage receipt's PCIe traffic (mode, bytes, transfer time).
  void ObserveReceipt(const boundary::v1::UsageReceipt& receipt);

  // Starts the background thread (checkpoints, evidence probes), then the operator gRPC server
  // and /metrics. Unavailable when an address cannot be bound; the background thread runs
  // regardless, so the caller may go on without the operator endpoints.
  absl::Status Start(Scheduler* scheduler, CloisterService* service, BlobStore* blobs);
  const std::string& operator_address() const { return operator_address_; }
  const std::string& metrics_address() const { return metrics_address_; }

  // Reloads the config (ConfigReloader), records the outcome in the audit log (policy_reloaded
  // and tenant_config_changed, or reload_refused), and returns a one-line summary or the
  // reloader's error.
  absl::StatusOr<std::string> Reload();

  // Records daemon_stopped, signs a last checkpoint, stops the servers and the thread and syncs
  // the audit log. Call before the workers stop. Idempotent.
  void Stop();

 private:
  OperatorPlane(OperatorPlaneOptions options, std::vector<EnclaveClient*> workers,
                ConfigReloader* reloader, std::unique_ptr<AuditLog> audit);
  std::vector<std::string> TenantIds() const;
  void UpdateTenantClasses();
  absl::StatusOr<boundary::v1::SignedAuditCheckpoint> SignCheckpoint(ByteSpan digest,
                                                                     uint64_t sequence);
  void Checkpoint();
  void ProbeEvidence();
  // Asks every worker for its statistics and keeps them for the next scrape.
  void ProbeStats();
  // The service's gauges plus the workers' last statistics.
  GaugeSnapshot Gauges();
  void BackgroundLoop();

  const OperatorPlaneOptions options_;
  const std::vector<EnclaveClient*> workers_;
  ConfigReloader* const reloader_;
  std::unique_ptr<AuditLog> audit_;
  Metrics metrics_;
  EvidenceTracker evidence_;
  Scheduler* scheduler_ = nullptr;
  BlobStore* blobs_ = nullptr;  // set by Start, before the background thread runs
  std::unique_ptr<OperatorService> service_;
  std::unique_ptr<grpc::Server> operator_server_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::string operator_address_;
  std::string metrics_address_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread background_;

  // What each worker last reported (its model memory mapped to tenants through the blob store);
  // a worker whose probe failed reports nothing until it answers again.
  struct WorkerStats {
    std::map<std::string, uint64_t> model_memory_by_tenant;
    bool has_device_memory = false;
    uint64_t device_memory_total_size = 0;
    uint64_t device_memory_used_size = 0;
    struct Generations {
      uint64_t running = 0, waiting = 0, kv_blocks = 0;
    };
    std::map<std::string, Generations> generations_by_tenant;
    uint64_t kv_blocks_total = 0;
    uint64_t kv_blocks_used = 0;
    uint64_t interrupted_steps = 0;
  };
  absl::Mutex stats_mu_;
  std::vector<WorkerStats> worker_stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace cloister::host
