// The operator side of cloisterd (docs/OPERATIONS.md): the cloister.ops.v1.Operator gRPC
// service (Status, Reload) that `cloister status` reads, the gauges of the /metrics endpoint,
// the evidence each worker last showed, and the interceptor that counts every tenant API call
// for the metrics.
//
// Nothing here sees tenant data: it reads counts from the scheduler, the session table and the
// blob store, evidence metadata (collection time, the enclave's public signing key, a hash of
// the bundle), and the audit log's counters.
//
// Threading: all methods are thread-safe. The RPC handlers hand their work (which reads the
// disk, or reloads the config) to a SerialWorker, so gRPC threads never wait on it.
// Ownership: everything in OperatorSources is borrowed and must outlive the service.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "cloister/ops/v1/ops.grpc.pb.h"
#include "grpcpp/support/server_interceptor.h"
#include "host/audit/audit_log.h"
#include "host/metrics/metrics.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/server/serial_worker.h"
#include "host/storage/blob_store.h"

namespace cloister::host {

// The newest evidence seen from each worker (at start-up, on tenants' GetEvidence calls, and on
// cloisterd's periodic probe). A bundle that differs from the worker's previous one is an
// evidence refresh: logged, and an `evidence_refreshed` audit entry when there is an audit log.
class EvidenceTracker {
 public:
  struct Seen {
    absl::Time collected_at = absl::InfinitePast();  // InfinitePast: none seen
    Bytes signing_public_key;
    std::string bundle_sha256;  // hex
  };

  EvidenceTracker(int worker_count, AuditLog* audit);

  // Reads the bundle in a GetEvidence answer of `worker`; an answer that does not parse is
  // ignored (the tenant's verifier is the judge of evidence, not this).
  void Observe(int worker, const boundary::v1::GetEvidenceResult& result);
  std::vector<Seen> Snapshot() const;

 private:
  AuditLog* const audit_;
  mutable absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

struct OperatorSources {
  Scheduler* scheduler = nullptr;       // required
  CloisterService* service = nullptr;   // required
  BlobStore* blobs = nullptr;           // required
  EvidenceTracker* evidence = nullptr;  // required
  AuditLog* audit = nullptr;            // optional
  // Per worker: its TEE and GPU evidence sources ("sim", "sev-snp", ...), in worker order.
  std::vector<std::pair<std::string, std::string>> worker_kinds;
  // The configured tenant ids (they change with a reload).
  std::function<std::vector<std::string>()> tenant_ids;
  // Reloads tenants and policies and says what changed in one line; unset: Reload answers
  // UNIMPLEMENTED.
  std::function<absl::StatusOr<std::string>()> reload;
  Clock* clock = nullptr;  // nullptr: Clock::Real()
};

class OperatorService final : public ops::v1::Operator::CallbackService {
 public:
  explicit OperatorService(OperatorSources sources);
  ~OperatorService() override;

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const ops::v1::StatusRequest* request,
                                   ops::v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Reload(grpc::CallbackServerContext* context,
                                   const ops::v1::ReloadRequest* request,
                                   ops::v1::ReloadResponse* response) override;

  // What Status answers (reads the blob store's listing).
  ops::v1::StatusResponse Snapshot() const;
  // The gauges of /metrics, from the same sources.
  GaugeSnapshot Gauges() const;

 private:
  const OperatorSources sources_;
  Clock* const clock_;
  const absl::Time started_;
  SerialWorker worker_;  // last member: its destructor runs the posted tasks first
};

// Counts every call of the tenant API (cloister.api.v1.Cloister) in `metrics` by method,
// tenant and status code. Register with grpc::ServerBuilder::experimental()
// .SetInterceptorCreators. `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRequestMetricsInterceptorFactory(Metrics* metrics);

// Starts the operator gRPC server on `listen` ("unix:PATH" or HOST:PORT). Returns the server and
// the address it listens on (with the real port for port 0). Unavailable when it cannot bind.
struct RunningOperatorServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};
absl::StatusOr<RunningOperatorServer> StartOperatorServer(OperatorService* service,
                                                          const std::string& listen);

}  // namespace cloister::host
