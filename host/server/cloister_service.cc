#include "host/server/cloister_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "host/common/ids.h"
#include "host/common/std_string_view.h"
#include "host/server/generate_reactor.h"
#include "host/server/infer_reactor.h"
#include "host/server/sealed_relay.h"
#include "host/server/upload_reactor.h"
#include "proto/duration.h"
#include "proto/error_reason.h"

namespace cloister::host {
namespace {

using api::v1::GetEvidenceRequest;
using api::v1::GetEvidenceResponse;
using api::v1::OpenSessionRequest;
using api::v1::OpenSessionResponse;
using api::v1::SealedChunk;
using api::v1::SealedReply;
using api::v1::SealedRequest;
using api::v1::UploadModelRequest;
using api::v1::UploadModelResponse;
using boundary::v1::EnclaveReply;
using boundary::v1::HostToEnclave;

constexpr char kUnauthenticated[] = "unknown tenant or wrong API token";
constexpr size_t kNonceSize = 32;
constexpr size_t kHpkeEncSize = 32;  // DHKEM(X25519)
constexpr size_t kEvidenceDigestSize = 32;
constexpr size_t kMaxSealedHelloSize = 64 << 10;

std::string MetadataValue(const grpc::CallbackServerContext& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

void LogRefused(absl::string_view method, absl::string_view tenant_id, const absl::Status& status) {
  Log(LogLevel::kInfo, "rpc_refused",
      {{"method", ToStd(method)},
       {"tenant", ToStd(tenant_id)},
       {"code", absl::StatusCodeToString(status.code())},
       {"error", ToStd(status.message())}});
}

// The reactor of the unary RPCs other than Infer.
class TrackedUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit TrackedUnaryReactor(RpcInFlight in_flight) : in_flight_(std::move(in_flight)) {}
  void OnDone() override { delete this; }

 private:
  RpcInFlight in_flight_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      proto::GrpcErrorDetails(status));
}

grpc::ServerUnaryReactor* CloisterService::NewUnaryReactor() {
  return new TrackedUnaryReactor(RpcInFlight(&rpcs_));
}

void CloisterService::BeginDrain() { rpcs_.BeginDrain(); }

bool CloisterService::WaitUntilIdle(absl::Duration timeout) { return rpcs_.WaitUntilIdle(timeout); }

int CloisterService::active_rpcs() const { return rpcs_.count(); }

// ---- The service ----

CloisterService::CloisterService(TenantRegistry* tenants, EnclaveClient* enclave,
                                 Scheduler* scheduler, BlobStore* blobs, ServiceOptions options)
    : CloisterService(tenants, std::vector<EnclaveClient*>{enclave}, scheduler, blobs,
                      std::move(options)) {}

CloisterService::CloisterService(TenantRegistry* tenants, std::vector<EnclaveClient*> workers,
                                 Scheduler* scheduler, BlobStore* blobs, ServiceOptions options)
    : tenants_(tenants),
      workers_(std::move(workers)),
      scheduler_(scheduler),
      blobs_(blobs),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      sessions_(clock_, options.session_ttl, options.max_sessions_per_tenant),
      upload_watchdog_(clock_, options.upload_idle_timeout, options.upload_timeout) {
  CLOISTER_CHECK(!workers_.empty());
  for (EnclaveClient* worker : workers_) CLOISTER_CHECK(worker != nullptr);
  CLOISTER_CHECK(options_.upload_idle_timeout > absl::ZeroDuration() &&
                 options_.upload_timeout > absl::ZeroDuration());
  if (options_.audit != nullptr) {
    sessions_.SetOnExpiredForAudit([audit = options_.audit](const std::string& tenant_id,
                                                            int worker) {
      absl::Status recorded = audit->Record(audit_event::kSessionClosed, tenant_id,
                                            {{"worker", absl::StrCat(worker)},
                                             {"reason", "expired"}});
      if (!recorded.ok()) {
        Log(LogLevel::kError, "audit_write_failed", {{"error", recorded.ToString()}});
      }
    });
  }
}

void CloisterService::Refused(absl::string_view method, absl::string_view tenant_id,
                              const absl::Status& status) {
  LogRefused(method, tenant_id, status);
  // Load refusals (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED...) are counted in the metrics; the
  // audit log keeps the ones that say someone reached for what is not theirs.
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    Audit(audit_event::kRefused, tenant_id,
          {{"method", std::string(method)}, {"code", absl::StatusCodeToString(status.code())},
           {"reason", std::string(status.message())}});
  } else if (status.GetPayload(kForeignSessionPayload).has_value()) {
    // Answered like an unknown session, but it was another tenant's: worth an auditor's look.
    Audit(audit_event::kRefused, tenant_id,
          {{"method", std::string(method)}, {"code", absl::StatusCodeToString(status.code())},
           {"reason", "another tenant's session"}});
  }
}

void CloisterService::Audit(absl::string_view event, absl::string_view tenant_id,
                            const AuditDetails& details) {
  if (options_.audit == nullptr) return;
  absl::Status recorded = options_.audit->Record(event, tenant_id, details);
  if (!recorded.ok()) {
    Log(LogLevel::kError, "audit_write_failed", {{"error", recorded.ToString()}});
  }
}

absl::StatusOr<uint64_t> CloisterService::ReserveModelMemory(const std::string& tenant_id,
                                                             const std::string& handle,
                                                             uint64_t size) {
  uint64_t quota = scheduler_->LimitsFor(tenant_id).model_memory_quota;
  absl::StatusOr<std::vector<StoredModel>> stored = blobs_->List();
  if (!stored.ok()) {
    Log(LogLevel::kError, "model_list_failed", {{"error", stored.status().ToString()}});
    return absl::InternalError("cloisterd cannot read its model store");
  }
  absl::MutexLock lock(&quota_mu_);
  uint64_t stored_size = 0;
  for (const StoredModel& model : *stored) {
    // An upload under an existing handle replaces that model.
    if (model.tenant_id != tenant_id || model.handle == handle) continue;
    // What the enclave reported the model takes in its memory, else (an ONNX model) its size.
    auto reported = model_memory_size_.find(std::make_pair(model.tenant_id, model.handle));
    stored_size += reported != model_memory_size_.end() ? reported->second : model.ciphertext_size;
  }
  uint64_t& uploading = uploading_size_[tenant_id];
  if (stored_size + uploading + size > quota) {
    uint64_t in_progress = uploading;
    if (uploading == 0) uploading_size_.erase(tenant_id);
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "tenant ", tenant_id, ": model memory quota of ", quota, " bytes exceeded (",
            stored_size, " bytes stored, ", in_progress, " being uploaded, this model ", size,
            " bytes)")),
        api::v1::QUOTA_EXCEEDED);
  }
  uint64_t budget = quota - stored_size - uploading;
  uploading += size;
  return budget;
}

void CloisterService::ReleaseModelMemory(const std::string& tenant_id, uint64_t size) {
  absl::MutexLock lock(&quota_mu_);
  auto it = uploading_size_.find(tenant_id);
  CLOISTER_CHECK(it != uploading_size_.end() && it->second >= size);
  it->second -= size;
  if (it->second == 0) uploading_size_.erase(it);
}

void CloisterService::RecordModelMemory(const std::string& tenant_id, const std::string& handle,
                                        uint64_t memory_size) {
  absl::MutexLock lock(&quota_mu_);
  std::pair<std::string, std::string> key(tenant_id, handle);
  if (memory_size > 0) {
    model_memory_size_[key] = memory_size;
  } else {
    model_memory_size_.erase(key);
  }
}

CloisterService::~CloisterService() {
  // A Generate reactor outlives its RPC until the enclave's stream has ended, and uses the
  // service until then; the server's shutdown cancelled the RPC, so the end comes soon (or the
  // worker is stopped, which ends it too).
  if (!rpcs_.WaitUntilIdle(absl::Seconds(5))) {
    Log(LogLevel::kWarning, "service_waiting_for_streams",
        {{"active_rpcs", rpcs_.count()}, {"reason", "generation streams have not ended yet"}});
    rpcs_.WaitUntilIdle(absl::InfiniteDuration());
  }
}

absl::StatusOr<std::string> CloisterService::Authenticate(
    const grpc::CallbackServerContext& context, absl::string_view method) const {
  RETURN_IF_ERROR(rpcs_.CheckAccepting());
  std::string tenant_id = MetadataValue(context, "x-cloister-tenant");
  std::string authorization = MetadataValue(context, "authorization");
  constexpr absl::string_view kBearer = "Bearer ";  // the scheme is case-insensitive
  // Mutual TLS: whether the tenant is bound to client certificates and, if so, whether this
  // peer's verified certificate names one of them (the error says it does not).
  absl::StatusOr<bool> by_certificate = false;
  if (!tenant_id.empty() && options_.admit_by_certificate) {
    std::shared_ptr<const grpc::AuthContext> peer = context.auth_context();
    if (peer != nullptr) by_certificate = options_.admit_by_certificate(tenant_id, *peer);
  }
  absl::Status status;
  if (tenant_id.empty()) {
    status = absl::UnauthenticatedError(kUnauthenticated);
  } else if (!by_certificate.ok()) {
    status = by_certificate.status();
  } else if (authorization.empty() && *by_certificate) {
    status = absl::OkStatus();  // a certificate-bound tenant without a token
  } else if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    status = absl::UnauthenticatedError(kUnauthenticated);
  } else {
    // A token that is sent must be right, also from a tenant the certificate admits.
    status =
        tenants_->Authenticate(tenant_id, absl::string_view(authorization).substr(kBearer.size()));
  }
  if (!status.ok()) {
    std::string claimed = IsValidTenantId(tenant_id) ? tenant_id : std::string("(invalid)");
    Log(LogLevel::kWarning, "authentication_failed",
        {{"method", ToStd(method)}, {"tenant", claimed}, {"peer", context.peer()}});
    if (options_.audit != nullptr) {
      absl::Status recorded = options_.audit->Record(
          audit_event::kRefused, "",
          {{"method", std::string(method)}, {"code", "UNAUTHENTICATED"}, {"claimed_tenant", claimed},
           {"peer", context.peer()}});
      if (!recorded.ok()) {
        Log(LogLevel::kError, "audit_write_failed", {{"error", recorded.ToString()}});
      }
    }
    return status;
  }
  return tenant_id;
}

absl::StatusOr<int> CloisterService::CheckSealedRequest(const SealedRequest& call,
                                                     absl::string_view tenant_id,
                                                     bool require_handle) {
  if (call.session_id().empty() || call.session_id().size() > kMaxSessionIdSize) {
    return absl::InvalidArgumentError("sealed call needs a session id");
  }
  RETURN_IF_ERROR(CheckRequestId(call.request_id()));
  if (require_handle || !call.model_handle().empty()) {
    RETURN_IF_ERROR(CheckModelHandle(call.model_handle()));
  }
  if (call.ciphertext().empty()) return absl::InvalidArgumentError("sealed call is empty");
  if (call.ciphertext().size() > options_.max_sealed_message_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed call of ", call.ciphertext().size(), " bytes exceeds the limit of ",
                     options_.max_sealed_message_size, " bytes (limits.max_sealed_message_bytes)"));
  }
  if (call.has_deadline() && proto::FromProtoDuration(call.deadline()) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("deadline is negative");
  }
  ASSIGN_OR_RETURN(int worker, sessions_.WorkerFor(call.session_id(), tenant_id));
  if (worker < 0 || worker >= static_cast<int>(workers_.size())) {
    return absl::NotFoundError("unknown session; open a new session");
  }
  return worker;
}

grpc::ServerUnaryReactor* CloisterService::GetEvidence(grpc::CallbackServerContext* context,
                                                       const GetEvidenceRequest* request,
                                                       GetEvidenceResponse* response) {
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context, "GetEvidence");
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  if (request->nonce().size() != kNonceSize) {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("nonce must be ", kNonceSize, " bytes, got ", request->nonce().size()));
    Refused("GetEvidence", *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce(request->nonce());
  call.mutable_get_evidence()->set_fresh(request->fresh());
  size_t worker = next_evidence_worker_.fetch_add(1) % workers_.size();
  workers_[worker]->Call(std::move(call), [this, worker, reactor,
                                            response](EnclaveClient::Reply reply) {
    if (!reply.ok()) {
      reactor->Finish(ToGrpcStatus(reply.status()));
      return;
    }
    if (options_.on_evidence) options_.on_evidence(static_cast<int>(worker), reply->get_evidence());
    response->set_challenge_response(
        std::move(*reply->mutable_get_evidence()->mutable_challenge_response()));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* CloisterService::OpenSession(grpc::CallbackServerContext* context,
                                                       const OpenSessionRequest* request,
                                                       OpenSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context, "OpenSession");
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  absl::Status status;
  if (request->hpke_enc().size() != kHpkeEncSize) {
    status = absl::InvalidArgumentError(absl::StrCat("hpke_enc must be ", kHpkeEncSize,
                                                     " bytes, got ", request->hpke_enc().size()));
  } else if (request->evidence_digest().size() != kEvidenceDigestSize) {
    status =
        absl::InvalidArgumentError(absl::StrCat("evidence_digest must be ", kEvidenceDigestSize,
                                                " bytes, got ", request->evidence_digest().size()));
  } else if (request->sealed_hello().empty() ||
             request->sealed_hello().size() > kMaxSealedHelloSize) {
    status =
        absl::InvalidArgumentError(absl::StrCat("sealed_hello must be 1 to ", kMaxSealedHelloSize,
                                                " bytes, got ", request->sealed_hello().size()));
  } else {
    status = sessions_.CheckCapacity(*tenant);
  }
  if (!status.ok()) {
    Refused("OpenSession", *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  auto call = std::make_shared<HostToEnclave>();
  boundary::v1::OpenSessionCall* open = call->mutable_open_session();
  open->set_tenant_id(*tenant);
  open->set_hpke_enc(request->hpke_enc());
  open->set_sealed_hello(request->sealed_hello());
  open->set_evidence_digest(request->evidence_digest());
  OpenSessionOn(0, std::move(call), reactor, response, *tenant);
  return reactor;
}

void CloisterService::OpenSessionOn(size_t worker, std::shared_ptr<const HostToEnclave> call,
                                    grpc::ServerUnaryReactor* reactor,
                                    OpenSessionResponse* response, std::string tenant_id) {
  workers_[worker]->Call(*call, [this, worker, call, reactor, response,
                                 tenant_id = std::move(tenant_id)](EnclaveClient::Reply reply) {
    if (!reply.ok() && absl::IsFailedPrecondition(reply.status()) && worker + 1 < workers_.size()) {
      // This worker did not issue the evidence the client verified; another one did.
      OpenSessionOn(worker + 1, call, reactor, response, tenant_id);
      return;
    }
    if (!reply.ok()) {
      reactor->Finish(ToGrpcStatus(reply.status()));
      return;
    }
    boundary::v1::OpenSessionResult& result = *reply->mutable_open_session();
    if (result.session_id().empty() || result.session_id().size() > kMaxSessionIdSize) {
      reactor->Finish(ToGrpcStatus(absl::InternalError("enclave opened a session without an id")));
      return;
    }
    sessions_.Add(result.session_id(), tenant_id, static_cast<int>(worker));
    Audit(audit_event::kSessionOpened, tenant_id, {{"worker", absl::StrCat(worker)}});
    response->set_session_id(std::move(*result.mutable_session_id()));
    response->set_sequence(result.sequence());
    response->set_sealed_welcome(std::move(*result.mutable_sealed_welcome()));
    reactor->Finish(grpc::Status::OK);
  });
}

grpc::ServerReadReactor<UploadModelRequest>* CloisterService::UploadModel(
    grpc::CallbackServerContext* context, UploadModelResponse* response) {
  return new UploadReactor(RpcInFlight(&rpcs_), this, context, response);
}

grpc::ServerUnaryReactor* CloisterService::ListModels(grpc::CallbackServerContext* context,
                                                      const SealedRequest* request,
                                                      SealedReply* response) {
  return RelaySealedCall(context, request, response, /*is_delete=*/false);
}

grpc::ServerUnaryReactor* CloisterService::DeleteModel(grpc::CallbackServerContext* context,
                                                       const SealedRequest* request,
                                                       SealedReply* response) {
  return RelaySealedCall(context, request, response, /*is_delete=*/true);
}

grpc::ServerUnaryReactor* CloisterService::RelaySealedCall(grpc::CallbackServerContext* context,
                                                           const SealedRequest* request,
                                                           SealedReply* response, bool is_delete) {
  const char* method = is_delete ? "DeleteModel" : "ListModels";
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context, method);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  absl::StatusOr<int> worker = CheckSealedRequest(*request, *tenant, /*require_handle=*/false);
  if (!worker.ok()) {
    Refused(method, *tenant, worker.status());
    reactor->Finish(ToGrpcStatus(worker.status()));
    return reactor;
  }
  HostToEnclave call;
  boundary::v1::TenantCall* message =
      is_delete ? call.mutable_delete_model() : call.mutable_list_models();
  message->set_tenant_id(*tenant);
  *message->mutable_request() = ToForwardedRequest(*request, request->ciphertext());
  workers_[*worker]->Call(
      std::move(call), [this, reactor, response, is_delete, request_id = request->request_id(),
                        tenant_id = *tenant](EnclaveClient::Reply reply) {
        if (!reply.ok()) {
          reactor->Finish(ToGrpcStatus(reply.status()));
          return;
        }
        boundary::v1::TenantCallResult& result =
            is_delete ? *reply->mutable_delete_model() : *reply->mutable_list_models();
        absl::Status status = ToSealedReply(*result.mutable_reply(), request_id, *response);
        if (!status.ok()) {
          response->Clear();
          reactor->Finish(ToGrpcStatus(status));
          return;
        }
        if (!is_delete || !result.model_deleted()) {
          reactor->Finish(grpc::Status::OK);
          return;
        }
        if (!IsValidModelHandle(result.deleted_handle())) {
          Log(LogLevel::kError, "enclave_bad_deleted_handle", {{"tenant", tenant_id}});
          reactor->Finish(grpc::Status::OK);
          return;
        }
        // Answer once the stored copy is gone too, so a deleted model cannot come back on restart.
        file_worker_.Post([this, reactor, handle = result.deleted_handle(), tenant_id] {
          RemoveStoredModel(handle);
          Log(LogLevel::kInfo, "model_deleted", {{"tenant", tenant_id}, {"handle", handle}});
          Audit(audit_event::kModelDeleted, tenant_id, {{"handle", handle}});
          reactor->Finish(grpc::Status::OK);
        });
      });
  return reactor;
}

void CloisterService::RemoveStoredModel(const std::string& handle) {
  // The handle names one owner's model; any tenant folder holding it holds the same model.
  absl::StatusOr<std::vector<StoredModel>> stored = blobs_->List();
  if (!stored.ok()) {
    Log(LogLevel::kError, "model_delete_failed",
        {{"handle", handle}, {"error", stored.status().ToString()}});
    return;
  }
  for (const StoredModel& model : *stored) {
    if (model.handle != handle) continue;
    {
      absl::MutexLock lock(&quota_mu_);
      model_memory_size_.erase(std::make_pair(model.tenant_id, handle));
    }
    absl::Status status = blobs_->Delete(model.tenant_id, handle);
    if (!status.ok()) {
      Log(LogLevel::kError, "model_delete_failed",
          {{"tenant", model.tenant_id}, {"handle", handle}, {"error", status.ToString()}});
    }
  }
}

grpc::ServerUnaryReactor* CloisterService::Infer(grpc::CallbackServerContext* context,
                                                 const SealedRequest* request, SealedReply* response) {
  InferReactor* reactor = new InferReactor(RpcInFlight(&rpcs_), scheduler_);
  absl::StatusOr<std::string> tenant = Authenticate(*context, "Infer");
  absl::StatusOr<int> worker = absl::UnknownError("not checked");
  if (!tenant.ok()) {
    worker = tenant.status();
  } else {
    worker = CheckSealedRequest(*request, *tenant, /*require_handle=*/true);
    if (!worker.ok()) Refused("Infer", *tenant, worker.status());
  }
  if (!worker.ok()) {
    reactor->Finish(ToGrpcStatus(worker.status()));
    reactor->SetTicket(0);
    return reactor;
  }
  InferRequest infer;
  infer.tenant_id = *tenant;
  // The sealed request is the bulk of the call (megabytes for an image batch): it moves into
  // the boundary item instead of being copied. gRPC allocated `request` for this call alone and
  // frees it when the call ends; nothing reads its ciphertext after this line.
  infer.item =
      ToForwardedRequest(*request, std::move(*const_cast<SealedRequest*>(request)->mutable_ciphertext()));
  infer.worker = *worker;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    // The RPC's deadline is in real time; the scheduler's clock may be a test clock, so carry
    // over the time left rather than the instant.
    infer.deadline = clock_->Now() + (absl::FromChrono(context->deadline()) - absl::Now());
  }
  if (request->has_deadline()) {
    infer.deadline =
        std::min(infer.deadline, clock_->Now() + proto::FromProtoDuration(request->deadline()));
  }
  std::string request_id = request->request_id();
  std::string tenant_id = *tenant;
  Scheduler::Ticket ticket = scheduler_->Submit(
      std::move(infer), [this, reactor, response, request_id = std::move(request_id),
                         tenant_id = std::move(tenant_id)](absl::StatusOr<EnclaveReply> reply) {
        if (!reply.ok()) {
          if (absl::IsResourceExhausted(reply.status()) ||
              absl::IsDeadlineExceeded(reply.status())) {
            Refused("Infer", tenant_id, reply.status());
          }
          reactor->Finish(ToGrpcStatus(reply.status()));
          return;
        }
        absl::Status status = ToSealedReply(*reply, request_id, *response);
        if (!status.ok()) response->Clear();
        reactor->Finish(ToGrpcStatus(status));
      });
  // May run after the answer: the reactor stays alive until SetTicket.
  reactor->SetTicket(ticket);
  return reactor;
}

grpc::ServerWriteReactor<SealedChunk>* CloisterService::Generate(
    grpc::CallbackServerContext* context, const SealedRequest* request) {
  auto* reactor = new GenerateReactor(RpcInFlight(&rpcs_));
  absl::StatusOr<std::string> tenant = Authenticate(*context, "Generate");
  if (!tenant.ok()) {
    reactor->Refuse(tenant.status());
    return reactor;
  }
  absl::StatusOr<int> worker = CheckSealedRequest(*request, *tenant, /*require_handle=*/true);
  absl::Status status = worker.status();
  // What the enclave may still take: the RPC's deadline or the request's own, the earlier.
  absl::Duration time_left = absl::InfiniteDuration();
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    time_left = absl::FromChrono(context->deadline()) - absl::Now();
  }
  if (request->has_deadline()) {
    time_left = std::min(time_left, proto::FromProtoDuration(request->deadline()));
  }
  if (status.ok() && time_left <= absl::ZeroDuration()) {
    status = absl::DeadlineExceededError("generation deadline passed before it started");
  }
  if (status.ok()) {
    const TenantLimits& limits = scheduler_->LimitsFor(*tenant);
    if (request->ciphertext().size() > limits.max_payload_size) {
      status =
          proto::WithReason(absl::ResourceExhaustedError(absl::StrCat(
                                "tenant ", *tenant, ": payload of ", request->ciphertext().size(),
                                " bytes exceeds the limit of ", limits.max_payload_size, " bytes")),
                            api::v1::TOO_LARGE);
    }
  }
  if (status.ok()) status = AdmitGeneration(*tenant);
  if (!status.ok()) {
    Refused("Generate", *tenant, status);
    reactor->Refuse(status);
    return reactor;
  }
  HostToEnclave call;
  boundary::v1::GenerateCall* generate = call.mutable_generate();
  generate->set_tenant_id(*tenant);
  // As in Infer: the ciphertext moves into the call; nothing reads it from `request` later.
  *generate->mutable_request() = ToForwardedRequest(
      *request, std::move(*const_cast<SealedRequest*>(request)->mutable_ciphertext()));
  if (time_left != absl::InfiniteDuration()) {
    *generate->mutable_request()->mutable_time_left() = proto::ToProtoDuration(time_left);
  }
  // The tenant's class and weight, for the enclave's step scheduler (boundary numbering: the
  // config's PriorityClass values), and the token limits only the enclave can enforce.
  {
    const TenantLimits& limits = scheduler_->LimitsFor(*tenant);
    boundary::v1::GenerateLimits* out = generate->mutable_limits();
    switch (limits.priority) {
      case PriorityClass::kRealtime:
        out->set_priority_class(1);
        break;
      case PriorityClass::kStandard:
        out->set_priority_class(2);
        break;
      case PriorityClass::kBatch:
        out->set_priority_class(3);
        break;
    }
    out->set_weight(static_cast<uint32_t>(limits.weight));
    out->set_max_tokens(limits.max_tokens);
    out->set_kv_cache_tokens(limits.kv_cache_tokens);
    out->set_tokens_per_second(limits.tokens_per_second);
    out->set_token_burst(limits.token_burst);
  }
  reactor->Start(
      workers_[*worker], std::move(call), request->request_id(),
      [this, worker = *worker, tenant_id = *tenant](const EnclaveClient::Reply& last,
                                                    const GenerateReactor::Timing& timing) {
        ReleaseGeneration(tenant_id);
        if (options_.on_generation_done && !timing.chunk_times.empty()) {
          std::vector<absl::Duration> gaps;
          for (size_t i = 1; i < timing.chunk_times.size(); ++i) {
            gaps.push_back(timing.chunk_times[i] - timing.chunk_times[i - 1]);
          }
          options_.on_generation_done(tenant_id, timing.chunk_times.front() - timing.started,
                                      gaps, last.ok());
        }
        if (last.ok() && last->generate().has_receipt() && options_.on_generate_receipt) {
          options_.on_generate_receipt(worker, last->generate().receipt());
        }
      });
  return reactor;
}

absl::Status CloisterService::AdmitGeneration(const std::string& tenant_id) {
  const int limit = scheduler_->LimitsFor(tenant_id).max_generations;
  absl::MutexLock lock(&generation_mu_);
  int& running = generations_[tenant_id];
  if (running >= limit) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant_id, ": at its limit of ", limit,
                                                  limit == 1 ? " generation" : " generations",
                                                  " at once (max_generations); retry later")),
        api::v1::OVERLOADED);
  }
  ++running;
  return absl::OkStatus();
}

void CloisterService::ReleaseGeneration(const std::string& tenant_id) {
  absl::MutexLock lock(&generation_mu_);
  auto it = generations_.find(tenant_id);
  if (it != generations_.end() && --it->second <= 0) generations_.erase(it);
}

}  // namespace cloister::host
