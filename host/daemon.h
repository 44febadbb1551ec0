// Daemon: cloisterd once its settings are known (host/main.cc parses them), in three steps.
//
//   Create   blocks the stop and reload signals for every thread it starts, checks the enclave
//            binary and the data dir (0700), then creates the tenants (the development tenant
//            "demo" with its token in DATA_DIR/demo.token unless the config lists tenants), the
//            enclave workers under their supervisor (host/supervisor/worker_supervisor.h), the
//            model store, the receipt log, the operator plane, the scheduler and the tenant
//            service.
//   Serve    starts the tenant gRPC server (TLS when the config has a `tls` section) and the
//            operator plane's endpoints, then prints exactly one line on stdout:
//            "cloisterd listening on HOST:PORT". An address that cannot be bound, the operator
//            one too, is an error: start-up fails.
//   WaitForStop  SIGHUP reloads the config file's tenants and attestation policies (a bad file
//            is refused and logged); SIGTERM or SIGINT returns 0, a worker that died and cannot
//            be restarted returns 1.
//   Shutdown stops accepting, lets in-flight calls finish (with a deadline), closes the
//            servers, signs a last audit checkpoint, stops the scheduler and the workers and
//            syncs the receipt log. The destructor does it if it has not been done.
//
// Threading: the steps are called in order from the main thread, which takes the signals.
// Ownership: the Daemon owns everything it creates.
#pragma once

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "host/config/config_reloader.h"
#include "host/config/daemon_config.h"
#include "host/config/tenant_tls.h"
#include "host/operator/operator_plane.h"
#include "host/receipts/receipt_log.h"
#include "host/receipts/receipt_sink.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/server/grpc_server.h"
#include "host/storage/file_blob_store.h"
#include "host/supervisor/worker_supervisor.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {

class Daemon {
 public:
  // Everything up to the servers; the error says what could not be created (whatever was
  // started by then is stopped again).
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonConfig& config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The tenant server and the operator endpoints; Unavailable naming the address that cannot
  // be bound.
  absl::Status Serve();
  // Until a stop signal (0) or a worker given up (1); reloads on SIGHUP meanwhile.
  int WaitForStop();
  // The ordered stop. Idempotent.
  void Shutdown();

 private:
  class WorkerKeys;

  explicit Daemon(const DaemonConfig& config);
  absl::Status CreateAll();
  absl::Status CheckDataDir();
  absl::Status StartWorkers();
  absl::Status CreateServices();

  const DaemonConfig config_;
  sigset_t signals_;
  std::string enclave_binary_;
  std::string data_dir_;
  const std::vector<DeviceConfig> devices_;

  // Read by the supervisor's callbacks (its threads) from Create until Shutdown.
  std::atomic<bool> worker_given_up_{false};
  std::unique_ptr<WorkerKeys> enclave_keys_;  // each worker's evidence signing key
  std::vector<boundary::v1::GetEvidenceResult> startup_evidence_;
  std::atomic<OperatorPlane*> evidence_observer_{nullptr};  // set once the plane exists

  // In the order of creation; destroyed the other way round.
  std::shared_ptr<TenantIdentityCheck> identities_;
  std::shared_ptr<grpc::ServerCredentials> tenant_credentials_;
  std::unique_ptr<TenantRegistry> registry_;
  std::unique_ptr<ConfigReloader> reloader_;
  std::unique_ptr<FileBlobStore> blobs_;
  std::unique_ptr<WorkerSupervisor> supervisor_;
  std::unique_ptr<ReceiptLog> receipt_log_;
  std::unique_ptr<OperatorPlane> plane_;
  // Verifies and writes the receipts off the workers' reader threads (borrows the two above).
  std::unique_ptr<ReceiptSink> receipt_sink_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<CloisterService> service_;
  RunningServer server_;
  bool shut_down_ = false;
};

}  // namespace cloister::host
