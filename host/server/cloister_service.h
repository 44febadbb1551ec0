// CloisterService: the tenant-facing gRPC API (cloister.api.v1.Cloister) of cloisterd, on
// gRPC's callback API so that no gRPC thread ever waits for the enclave or the disk.
//
// Every RPC first authenticates the tenant from metadata `x-cloister-tenant` and
// `authorization: Bearer TOKEN`, or, for a tenant bound to client certificates
// (ServiceOptions::admit_by_certificate), from its verified certificate alone when no token is
// sent (UNAUTHENTICATED otherwise), then checks the request's shape
// (sizes, handle and request id syntax) and that a named session was opened by this tenant
// (NOT_FOUND / PERMISSION_DENIED), and only then relays it:
//   GetEvidence -> GetEvidenceCall, OpenSession -> OpenSessionCall (remembers the session),
//   UploadModel -> checks the tenant's model-memory quota, stages the ciphertext in the
//                  BlobStore (an upload that sends nothing for upload_idle_timeout is ended
//                  with DEADLINE_EXCEEDED, one whose session's worker restarted meanwhile with
//                  UNAVAILABLE), LoadModelCall, loads the model into every other worker
//                  (ReloadModelCall with the wrapped key), commits the blob and the wrapped key
//                  only if the enclave returned one,
//   ListModels / DeleteModel -> TenantCall (a confirmed delete also removes the stored
//                  blob and wrapped key), Infer -> Scheduler (a cancelled RPC leaves the queue),
//   Generate -> GenerateCall on the session's worker, past the scheduler (the enclave batches
//                  token steps itself), its frames relayed as SealedChunks; a cancelled RPC (or
//                  one whose deadline passed) sends a CancelCall. Admission: at most the tenant's
//                  max_queued_requests generations at once (RESOURCE_EXHAUSTED, OVERLOADED) and
//                  its max_payload_size (TOO_LARGE); the final chunk's usage receipt goes to
//                  ServiceOptions::on_generate_receipt.
//
// Several enclave workers: each holds its own keys and sessions. GetEvidence goes round robin,
// OpenSession goes to the worker whose evidence the client verified (tried in order until one
// recognizes the evidence digest), and every sealed call of a session goes to its worker.
// The host never sees plaintext: sealed replies are passed through untouched, and errors the
// enclave reports to the host (its boundary status) become the RPC status.
//
// Threading: handlers run on gRPC threads and return at once; completions run on the enclave
// client's thread or on the service's SerialWorker (file work); the service's own upload
// watchdog thread ends idle uploads. The reactors are in infer_reactor.h, upload_reactor.h and
// generate_reactor.h;
// each counts as in flight (rpc_in_flight.h) until gRPC is done with it.
// Ownership: the registry, enclave clients, scheduler and blob store are borrowed and must
// outlive the service; the service must outlive the grpc::Server that serves it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "host/audit/audit_log.h"
#include "host/enclave_client/enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "host/server/rpc_in_flight.h"
#include "host/server/serial_worker.h"
#include "host/server/session_table.h"
#include "host/server/upload_reactor.h"
#include "host/storage/blob_store.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {

struct ServiceOptions {
  uint64_t max_model_size = uint64_t{512} << 20;          // declared ciphertext size of an upload
  uint64_t max_sealed_message_size = uint64_t{64} << 20;  // one sealed call's ciphertext
  absl::Duration session_ttl = absl::Minutes(65);
  int max_sessions_per_tenant = 10000;
  // An upload that sends nothing for this long while the service waits for its next message
  // is ended (DEADLINE_EXCEEDED) and its quota and staged bytes are released.
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  // An upload still receiving from its client this long after it started is ended the same
  // way, however steadily it sends: a trickle just inside the idle timeout cannot hold its
  // quota reservation and staged bytes for hours.
  absl::Duration upload_timeout = absl::Minutes(30);
  Clock* clock = nullptr;  // nullptr: Clock::Real()
  // Where sessions opened and expired, models uploaded and deleted, and security refusals
  // (UNAUTHENTICATED, PERMISSION_DENIED) are recorded; nullptr: nowhere. Must outlive the service.
  AuditLog* audit = nullptr;
  // Mutual TLS admission (host/config/tenant_tls.h TenantIdentityCheck::AdmitByCertificate):
  // false when the tenant is not bound to client certificates, true when the peer's verified
  // certificate names one of its identities (the call may then come without an API token), an
  // error when it does not (the call is refused). Empty: API tokens only.
  std::function<absl::StatusOr<bool>(absl::string_view tenant_id, const grpc::AuthContext& peer)>
      admit_by_certificate;
  // Sees every GetEvidence answer (and which worker gave it), on the completion thread.
  std::function<void(int worker, const boundary::v1::GetEvidenceResult& result)> on_evidence;
  // Sees the signed usage receipt of every generation that carried one on its final chunk
  // (unverified: the receipt log checks it against the worker's key), on the enclave client's
  // thread. Must not block.
  std::function<void(int worker, const boundary::v1::SignedUsageReceipt& receipt)>
      on_generate_receipt;
  // Sees the timing of every generation stream that ended (for metrics), on the enclave
  // client's thread: its tenant, the time to its first chunk and the gaps between its chunks.
  // Must not block.
  std::function<void(const std::string& tenant_id, absl::Duration first_chunk,
                     const std::vector<absl::Duration>& gaps, bool ok)>
      on_generation_done;
};

class CloisterService final : public api::v1::Cloister::CallbackService {
 public:
  // `workers` are the enclave workers in the scheduler's order (at least one).
  CloisterService(TenantRegistry* tenants, std::vector<EnclaveClient*> workers,
                  Scheduler* scheduler, BlobStore* blobs, ServiceOptions options);
  CloisterService(TenantRegistry* tenants, EnclaveClient* enclave, Scheduler* scheduler,
                  BlobStore* blobs, ServiceOptions options);
  ~CloisterService() override;

  grpc::ServerUnaryReactor* GetEvidence(grpc::CallbackServerContext* context,
                                        const api::v1::GetEvidenceRequest* request,
                                        api::v1::GetEvidenceResponse* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* context,
                                        const api::v1::OpenSessionRequest* request,
                                        api::v1::OpenSessionResponse* response) override;
  grpc::ServerReadReactor<api::v1::UploadModelRequest>* UploadModel(
      grpc::CallbackServerContext* context, api::v1::UploadModelResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const api::v1::SealedRequest* request,
                                       api::v1::SealedReply* response) override;
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const api::v1::SealedRequest* request,
                                        api::v1::SealedReply* response) override;
  grpc::ServerUnaryReactor* Infer(grpc::CallbackServerContext* context,
                                  const api::v1::SealedRequest* request,
                                  api::v1::SealedReply* response) override;
  grpc::ServerWriteReactor<api::v1::SealedChunk>* Generate(
      grpc::CallbackServerContext* context, const api::v1::SealedRequest* request) override;

  // Shutdown, step 1: from now on every new RPC is refused with UNAVAILABLE "cloisterd is
  // shutting down"; RPCs already running carry on.
  void BeginDrain();
  // Shutdown, step 2: waits until no RPC is running (true) or `timeout` passes (false). Then
  // grpc::Server::Shutdown with an immediate deadline only closes idle connections (gRPC would
  // otherwise wait out its whole deadline for idle client channels to go away).
  bool WaitUntilIdle(absl::Duration timeout);
  int active_rpcs() const;
  // Live sessions per tenant (for the operator's status and the metrics).
  std::map<std::string, int> SessionCountsByTenant() { return sessions_.CountsByTenant(); }

 private:
  friend class UploadReactor;  // the upload's steps use the stores, workers and quota below

  // A reactor for a unary RPC that counts as active until gRPC is done with it.
  grpc::ServerUnaryReactor* NewUnaryReactor();

  // The authenticated tenant id of a call; UNAUTHENTICATED, or UNAVAILABLE while draining.
  absl::StatusOr<std::string> Authenticate(const grpc::CallbackServerContext& context,
                                           absl::string_view method) const;
  // Shape checks shared by sealed calls, then the session's owner; the session's worker.
  absl::StatusOr<int> CheckSealedRequest(const api::v1::SealedRequest& call, absl::string_view tenant_id,
                                      bool require_handle);
  // Tries OpenSession on `worker` and, if it does not know the evidence, on the next ones.
  void OpenSessionOn(size_t worker, std::shared_ptr<const boundary::v1::HostToEnclave> call,
                     grpc::ServerUnaryReactor* reactor, api::v1::OpenSessionResponse* response,
                     std::string tenant_id);
  // Model-memory quota: reserves `size` bytes of `tenant_id`'s quota for an upload of `handle`
  // (replacing any stored model of that handle), or RESOURCE_EXHAUSTED naming the quota. Returns
  // the quota this model may take in the enclave (at least `size`): the quota less the tenant's
  // other stored models and uploads, which bounds an LLM's weights (LoadModelCall). A stored
  // model counts the memory the enclave reported for it (model_memory_size_), else its size.
  absl::StatusOr<uint64_t> ReserveModelMemory(const std::string& tenant_id,
                                              const std::string& handle, uint64_t size);
  void ReleaseModelMemory(const std::string& tenant_id, uint64_t size);
  // A stored model of `handle` counts `memory_size` bytes from now on (0: its stored size).
  void RecordModelMemory(const std::string& tenant_id, const std::string& handle,
                         uint64_t memory_size);
  // ListModels and DeleteModel: one TenantCall each.
  grpc::ServerUnaryReactor* RelaySealedCall(grpc::CallbackServerContext* context,
                                            const api::v1::SealedRequest* request,
                                            api::v1::SealedReply* response, bool is_delete);
  // Logs a refused call; a PERMISSION_DENIED one also goes to the audit log.
  void Refused(absl::string_view method, absl::string_view tenant_id, const absl::Status& status);
  // Appends to the audit log when there is one (a failed write is logged, not returned).
  void Audit(absl::string_view event, absl::string_view tenant_id, const AuditDetails& details);
  // Removes every stored copy of a model the enclave confirmed deleted.
  void RemoveStoredModel(const std::string& handle);
  // Generate's admission: counts one more generation of `tenant_id`, or RESOURCE_EXHAUSTED
  // (OVERLOADED) when it already runs its limit; ReleaseGeneration when its stream has ended.
  absl::Status AdmitGeneration(const std::string& tenant_id);
  void ReleaseGeneration(const std::string& tenant_id);

  TenantRegistry* const tenants_;
  const std::vector<EnclaveClient*> workers_;
  Scheduler* const scheduler_;
  BlobStore* const blobs_;
  const ServiceOptions options_;
  Clock* const clock_;
  SessionTable sessions_;

  InFlightRpcs rpcs_;

  std::atomic<uint64_t> next_evidence_worker_{0};
  absl::Mutex quota_mu_;
  // Bytes of uploads in progress, per tenant, counted against the model-memory quota.
  absl::flat_hash_map<std::string, uint64_t> uploading_size_ ABSL_GUARDED_BY(quota_mu_);
  // Stored models' memory as the enclave reported it on load (LoadModelResult), by (tenant,
  // handle); a stored model without an entry (an ONNX model, or one loaded before a restart)
  // counts its ciphertext size.
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> model_memory_size_
      ABSL_GUARDED_BY(quota_mu_);

  absl::Mutex generation_mu_;
  // Generations whose enclave stream has not ended, per tenant (no entry: none).
  absl::flat_hash_map<std::string, int> generations_ ABSL_GUARDED_BY(generation_mu_);

  SerialWorker file_worker_;
  UploadWatchdog upload_watchdog_;  // last: its thread starts once everything above exists
};

// grpc::Status from absl::Status (the codes are the same numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace cloister::host
