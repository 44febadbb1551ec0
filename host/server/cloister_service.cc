#include "host/server/cloister_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "host/common/ids.h"
#include "host/common/std_string_view.h"

namespace cloister::host {
namespace {

using api::v1::GetEvidenceRequest;
using api::v1::GetEvidenceResponse;
using api::v1::OpenSessionRequest;
using api::v1::OpenSessionResponse;
using api::v1::SealedCall;
using api::v1::SealedReply;
using api::v1::UploadModelRequest;
using api::v1::UploadModelResponse;
using boundary::v1::HostToEnclave;
using boundary::v1::SealedItem;
using boundary::v1::SealedReplyItem;

constexpr char kUnauthenticated[] = "unknown tenant or wrong API token";
constexpr size_t kNonceSize = 32;
constexpr size_t kHpkeEncSize = 32;  // DHKEM(X25519)
constexpr size_t kEvidenceDigestSize = 32;
constexpr size_t kMaxSealedHelloSize = 64 << 10;
constexpr size_t kMaxSessionIdSize = 64;

std::string MetadataValue(const grpc::CallbackServerContext& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

SealedItem ToSealedItem(const SealedCall& call) {
  SealedItem item;
  item.set_session_id(call.session_id());
  item.set_request_id(call.request_id());
  item.set_model_handle(call.model_handle());
  item.set_sequence(call.sequence());
  item.set_ciphertext(call.ciphertext());
  return item;
}

// The sealed reply for `request_id`, or the host-visible error the enclave reported for it.
absl::Status ToSealedReply(SealedReplyItem& item, absl::string_view request_id,
                           SealedReply& response) {
  if (item.has_status() && item.status().code() != 0) return FromBoundaryStatus(item.status());
  if (item.request_id() != request_id) {
    return absl::InternalError("enclave replied for a different request id");
  }
  response.set_sequence(item.sequence());
  response.set_ciphertext(std::move(*item.mutable_ciphertext()));
  return absl::OkStatus();
}

void LogRefused(absl::string_view method, absl::string_view tenant_id, const absl::Status& status) {
  Log(LogLevel::kInfo, "rpc_refused",
      {{"method", ToStd(method)},
       {"tenant", ToStd(tenant_id)},
       {"code", absl::StatusCodeToString(status.code())},
       {"error", ToStd(status.message())}});
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// ---- Reactors ----

class CloisterService::TrackedUnaryReactor : public grpc::ServerUnaryReactor {
 public:
  explicit TrackedUnaryReactor(CloisterService* service) : service_(service) {
    service_->RpcStarted();
  }
  void OnDone() override {
    CloisterService* service = service_;
    delete this;
    service->RpcDone();
  }

 private:
  CloisterService* const service_;
};

grpc::ServerUnaryReactor* CloisterService::NewUnaryReactor() {
  return new TrackedUnaryReactor(this);
}

void CloisterService::RpcStarted() {
  absl::MutexLock lock(&rpc_mu_);
  ++active_rpcs_;
}

void CloisterService::RpcDone() {
  absl::MutexLock lock(&rpc_mu_);
  --active_rpcs_;
}

void CloisterService::BeginDrain() {
  absl::MutexLock lock(&rpc_mu_);
  draining_ = true;
}

bool CloisterService::WaitUntilIdle(absl::Duration timeout) {
  absl::MutexLock lock(&rpc_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rpc_mu_) { return active_rpcs_ == 0; };
  return rpc_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int CloisterService::active_rpcs() const {
  absl::MutexLock lock(&rpc_mu_);
  return active_rpcs_;
}

absl::Status CloisterService::CheckAccepting() const {
  absl::MutexLock lock(&rpc_mu_);
  if (draining_) return absl::UnavailableError("cloisterd is shutting down");
  return absl::OkStatus();
}

// ---- UploadModel ----

class CloisterService::UploadReactor : public grpc::ServerReadReactor<UploadModelRequest> {
 public:
  UploadReactor(CloisterService* service, grpc::CallbackServerContext* context,
                UploadModelResponse* response)
      : service_(service), response_(response) {
    service_->RpcStarted();
    absl::StatusOr<std::string> tenant = service_->Authenticate(*context, "UploadModel");
    if (!tenant.ok()) {
      state_ = State::kFinished;
      Finish(ToGrpcStatus(tenant.status()));
      return;
    }
    tenant_id_ = *std::move(tenant);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Fail(absl::InvalidArgumentError("upload stream ended before its finish message"));
      return;
    }
    switch (request_.part_case()) {
      case UploadModelRequest::kStart:
        if (state_ != State::kExpectStart) {
          Fail(absl::InvalidArgumentError("upload sent a second start message"));
          return;
        }
        HandleStart();
        return;
      case UploadModelRequest::kData:
        if (state_ != State::kReceiving) {
          Fail(absl::InvalidArgumentError("upload must begin with a start message"));
          return;
        }
        HandleData();
        return;
      case UploadModelRequest::kFinish:
        if (state_ != State::kReceiving) {
          Fail(absl::InvalidArgumentError("upload must begin with a start message"));
          return;
        }
        HandleFinish();
        return;
      case UploadModelRequest::PART_NOT_SET:
        break;
    }
    Fail(absl::InvalidArgumentError("upload message carries neither start, data nor finish"));
  }

  void OnDone() override {
    CloisterService* service = service_;
    delete this;
    service->RpcDone();
  }

 private:
  enum class State { kExpectStart, kReceiving, kLoading, kFinished };

  void HandleStart() {
    const UploadModelRequest::Start& start = request_.start();
    absl::Status status = CheckModelHandle(start.model_handle());
    if (status.ok() &&
        (start.session_id().empty() || start.session_id().size() > kMaxSessionIdSize)) {
      status = absl::InvalidArgumentError("upload start needs a session id");
    }
    if (status.ok() && start.ciphertext_size() == 0) {
      status = absl::InvalidArgumentError("upload declares an empty model");
    }
    if (status.ok() && start.ciphertext_size() > service_->options_.max_model_size) {
      status = absl::InvalidArgumentError(
          absl::StrCat("model of ", start.ciphertext_size(), " bytes exceeds the limit of ",
                       service_->options_.max_model_size, " bytes"));
    }
    if (status.ok()) status = service_->sessions_.CheckAccess(start.session_id(), tenant_id_);
    if (!status.ok()) {
      Fail(status);
      return;
    }
    absl::StatusOr<std::unique_ptr<BlobUpload>> upload =
        service_->blobs_->BeginUpload(tenant_id_, start.model_handle());
    if (!upload.ok()) {
      Log(LogLevel::kError, "upload_staging_failed",
          {{"tenant", tenant_id_}, {"error", upload.status().ToString()}});
      Fail(absl::InternalError("cloisterd cannot stage the upload"));
      return;
    }
    upload_ = *std::move(upload);
    session_id_ = start.session_id();
    handle_ = start.model_handle();
    declared_size_ = start.ciphertext_size();
    state_ = State::kReceiving;
    StartRead(&request_);
  }

  void HandleData() {
    const std::string& data = request_.data();
    if (upload_->size() + data.size() > declared_size_) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("upload sent more than the declared ", declared_size_, " bytes")));
      return;
    }
    absl::Status status = upload_->Append(data);
    if (!status.ok()) {
      Log(LogLevel::kError, "upload_staging_failed",
          {{"tenant", tenant_id_}, {"error", status.ToString()}});
      Fail(absl::InternalError("cloisterd cannot stage the upload"));
      return;
    }
    StartRead(&request_);
  }

  void HandleFinish() {
    SealedCall& finish = *request_.mutable_finish();
    absl::Status status;
    if (upload_->size() != declared_size_) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "upload sent ", upload_->size(), " of the declared ", declared_size_, " bytes"));
    } else if (finish.session_id() != session_id_) {
      status = absl::InvalidArgumentError("finish names a different session than start");
    } else if (finish.model_handle() != handle_) {
      status = absl::InvalidArgumentError("finish names a different model handle than start");
    } else {
      status = CheckRequestId(finish.request_id());
    }
    if (status.ok() && finish.ciphertext().empty()) {
      status = absl::InvalidArgumentError("finish carries no sealed load request");
    }
    if (status.ok() && finish.ciphertext().size() > service_->options_.max_sealed_message_size) {
      status = absl::InvalidArgumentError("sealed load request is too large");
    }
    if (!status.ok()) {
      Fail(status);
      return;
    }
    state_ = State::kLoading;
    request_id_ = finish.request_id();
    auto item = std::make_shared<SealedItem>(ToSealedItem(finish));
    service_->file_worker_.Post([this, item] { SendToEnclave(std::move(*item)); });
  }

  // On the file worker: read the staged ciphertext back and hand the model to the enclave.
  void SendToEnclave(SealedItem item) {
    absl::StatusOr<std::string> ciphertext = upload_->ReadAll();
    if (!ciphertext.ok()) {
      Log(LogLevel::kError, "upload_staging_failed",
          {{"tenant", tenant_id_}, {"error", ciphertext.status().ToString()}});
      Fail(absl::InternalError("cloisterd cannot read back the staged upload"));
      return;
    }
    HostToEnclave call;
    boundary::v1::LoadModelCall* load = call.mutable_load_model();
    load->set_tenant_id(tenant_id_);
    *load->mutable_request() = std::move(item);
    load->set_model_ciphertext(*std::move(ciphertext));
    service_->enclave_->Call(std::move(call), [this](EnclaveClient::Reply reply) {
      auto shared = std::make_shared<EnclaveClient::Reply>(std::move(reply));
      service_->file_worker_.Post([this, shared] { Complete(std::move(*shared)); });
    });
  }

  // On the file worker: store the model if the enclave loaded it, then answer.
  void Complete(EnclaveClient::Reply reply) {
    if (!reply.ok()) {
      Fail(reply.status());
      return;
    }
    boundary::v1::LoadModelResult& result = *reply->mutable_load_model();
    absl::Status status =
        ToSealedReply(*result.mutable_reply(), request_id_, *response_->mutable_reply());
    if (!status.ok()) {
      Fail(status);
      return;
    }
    if (result.wrapped_model_key().empty()) {
      // The enclave refused the model; why is sealed for the tenant. Nothing is stored.
      Log(LogLevel::kInfo, "upload_not_loaded", {{"tenant", tenant_id_}, {"handle", handle_}});
      upload_.reset();
      FinishOnce(absl::OkStatus());
      return;
    }
    uint64_t size = upload_->size();
    status = upload_->Commit(result.wrapped_model_key());
    upload_.reset();
    if (!status.ok()) {
      Log(LogLevel::kError, "model_store_failed",
          {{"tenant", tenant_id_}, {"handle", handle_}, {"error", status.ToString()}});
      response_->Clear();
      FinishOnce(absl::InternalError(
          "the enclave loaded the model but cloisterd could not store it; it will not survive a "
          "restart, upload it again"));
      return;
    }
    Log(LogLevel::kInfo, "model_stored",
        {{"tenant", tenant_id_}, {"handle", handle_}, {"size", static_cast<unsigned long>(size)}});
    FinishOnce(absl::OkStatus());
  }

  void Fail(const absl::Status& status) {
    LogRefused("UploadModel", tenant_id_, status);
    upload_.reset();  // removes the staged ciphertext
    response_->Clear();
    FinishOnce(status);
  }

  void FinishOnce(const absl::Status& status) {
    if (state_ == State::kFinished) return;
    state_ = State::kFinished;
    Finish(ToGrpcStatus(status));
  }

  CloisterService* const service_;
  UploadModelResponse* const response_;
  UploadModelRequest request_;
  State state_ = State::kExpectStart;
  std::string tenant_id_;
  std::string session_id_;
  std::string handle_;
  std::string request_id_;
  uint64_t declared_size_ = 0;
  std::unique_ptr<BlobUpload> upload_;
};

// ---- The service ----

CloisterService::CloisterService(TenantRegistry* tenants, EnclaveClient* enclave,
                                 Scheduler* scheduler, BlobStore* blobs, ServiceOptions options)
    : tenants_(tenants),
      enclave_(enclave),
      scheduler_(scheduler),
      blobs_(blobs),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      sessions_(clock_, options.session_ttl, options.max_sessions_per_tenant) {}

CloisterService::~CloisterService() = default;

absl::StatusOr<std::string> CloisterService::Authenticate(
    const grpc::CallbackServerContext& context, absl::string_view method) const {
  RETURN_IF_ERROR(CheckAccepting());
  std::string tenant_id = MetadataValue(context, "x-cloister-tenant");
  std::string authorization = MetadataValue(context, "authorization");
  constexpr absl::string_view kBearer = "Bearer ";  // the scheme is case-insensitive
  absl::Status status;
  if (tenant_id.empty() || !absl::StartsWithIgnoreCase(authorization, kBearer)) {
    status = absl::UnauthenticatedError(kUnauthenticated);
  } else {
    status =
        tenants_->Authenticate(tenant_id, absl::string_view(authorization).substr(kBearer.size()));
  }
  if (!status.ok()) {
    Log(LogLevel::kWarning, "authentication_failed",
        {{"method", ToStd(method)},
         {"tenant", IsValidTenantId(tenant_id) ? tenant_id : std::string("(invalid)")},
         {"peer", context.peer()}});
    return status;
  }
  return tenant_id;
}

absl::Status CloisterService::CheckSealedCall(const SealedCall& call, absl::string_view tenant_id,
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
    return absl::InvalidArgumentError(absl::StrCat("sealed call of ", call.ciphertext().size(),
                                                   " bytes exceeds the limit of ",
                                                   options_.max_sealed_message_size));
  }
  if (call.deadline_ms() < 0) return absl::InvalidArgumentError("deadline_ms is negative");
  return sessions_.CheckAccess(call.session_id(), tenant_id);
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
    LogRefused("GetEvidence", *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce(request->nonce());
  call.mutable_get_evidence()->set_fresh(request->fresh());
  enclave_->Call(std::move(call), [reactor, response](EnclaveClient::Reply reply) {
    if (!reply.ok()) {
      reactor->Finish(ToGrpcStatus(reply.status()));
      return;
    }
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
    LogRefused("OpenSession", *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  HostToEnclave call;
  boundary::v1::OpenSessionCall* open = call.mutable_open_session();
  open->set_tenant_id(*tenant);
  open->set_hpke_enc(request->hpke_enc());
  open->set_sealed_hello(request->sealed_hello());
  open->set_evidence_digest(request->evidence_digest());
  enclave_->Call(std::move(call), [this, reactor, response,
                                   tenant_id = *tenant](EnclaveClient::Reply reply) {
    if (!reply.ok()) {
      reactor->Finish(ToGrpcStatus(reply.status()));
      return;
    }
    boundary::v1::OpenSessionResult& result = *reply->mutable_open_session();
    if (result.session_id().empty() || result.session_id().size() > kMaxSessionIdSize) {
      reactor->Finish(ToGrpcStatus(absl::InternalError("enclave opened a session without an id")));
      return;
    }
    sessions_.Add(result.session_id(), tenant_id);
    response->set_session_id(std::move(*result.mutable_session_id()));
    response->set_sequence(result.sequence());
    response->set_sealed_welcome(std::move(*result.mutable_sealed_welcome()));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerReadReactor<UploadModelRequest>* CloisterService::UploadModel(
    grpc::CallbackServerContext* context, UploadModelResponse* response) {
  return new UploadReactor(this, context, response);
}

grpc::ServerUnaryReactor* CloisterService::ListModels(grpc::CallbackServerContext* context,
                                                      const SealedCall* request,
                                                      SealedReply* response) {
  return RelaySealedCall(context, request, response, /*is_delete=*/false);
}

grpc::ServerUnaryReactor* CloisterService::DeleteModel(grpc::CallbackServerContext* context,
                                                       const SealedCall* request,
                                                       SealedReply* response) {
  return RelaySealedCall(context, request, response, /*is_delete=*/true);
}

grpc::ServerUnaryReactor* CloisterService::RelaySealedCall(grpc::CallbackServerContext* context,
                                                           const SealedCall* request,
                                                           SealedReply* response, bool is_delete) {
  const char* method = is_delete ? "DeleteModel" : "ListModels";
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context, method);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  absl::Status status = CheckSealedCall(*request, *tenant, /*require_handle=*/false);
  if (!status.ok()) {
    LogRefused(method, *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  HostToEnclave call;
  boundary::v1::SealedCallMessage* message =
      is_delete ? call.mutable_delete_model() : call.mutable_list_models();
  message->set_tenant_id(*tenant);
  *message->mutable_request() = ToSealedItem(*request);
  enclave_->Call(
      std::move(call), [this, reactor, response, is_delete, request_id = request->request_id(),
                        tenant_id = *tenant](EnclaveClient::Reply reply) {
        if (!reply.ok()) {
          reactor->Finish(ToGrpcStatus(reply.status()));
          return;
        }
        boundary::v1::SealedCallResult& result =
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
    absl::Status status = blobs_->Delete(model.tenant_id, handle);
    if (!status.ok()) {
      Log(LogLevel::kError, "model_delete_failed",
          {{"tenant", model.tenant_id}, {"handle", handle}, {"error", status.ToString()}});
    }
  }
}

grpc::ServerUnaryReactor* CloisterService::Infer(grpc::CallbackServerContext* context,
                                                 const SealedCall* request, SealedReply* response) {
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context, "Infer");
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  absl::Status status = CheckSealedCall(*request, *tenant, /*require_handle=*/true);
  if (!status.ok()) {
    LogRefused("Infer", *tenant, status);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  InferRequest infer;
  infer.tenant_id = *tenant;
  infer.item = ToSealedItem(*request);
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    // The RPC's deadline is in real time; the scheduler's clock may be a test clock, so carry
    // over the time left rather than the instant.
    infer.deadline = clock_->Now() + (absl::FromChrono(context->deadline()) - absl::Now());
  }
  if (request->deadline_ms() > 0) {
    infer.deadline =
        std::min(infer.deadline, clock_->Now() + absl::Milliseconds(request->deadline_ms()));
  }
  std::string request_id = request->request_id();
  scheduler_->Submit(std::move(infer), [reactor, response, request_id = std::move(request_id)](
                                           absl::StatusOr<SealedReplyItem> reply) {
    if (!reply.ok()) {
      reactor->Finish(ToGrpcStatus(reply.status()));
      return;
    }
    absl::Status status = ToSealedReply(*reply, request_id, *response);
    if (!status.ok()) response->Clear();
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace cloister::host
