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

// The boundary item for `call`, carrying `ciphertext` (the call's, copied or moved in).
SealedItem ToSealedItem(const SealedCall& call, std::string ciphertext) {
  SealedItem item;
  item.set_session_id(call.session_id());
  item.set_request_id(call.request_id());
  item.set_model_handle(call.model_handle());
  item.set_sequence(call.sequence());
  item.set_ciphertext(std::move(ciphertext));
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

// Infer's reactor: a client cancellation (or an expired RPC deadline) takes the request out of
// the scheduler's queue. It lives until both gRPC is done with it and Infer() has handed it
// the request's ticket, so the ticket never lands in a deleted reactor.
class CloisterService::InferReactor : public grpc::ServerUnaryReactor {
 public:
  explicit InferReactor(CloisterService* service) : service_(service) { service_->RpcStarted(); }

  // Called once by Infer() after Submit (ticket 0: answered at once).
  void SetTicket(Scheduler::Ticket ticket) {
    bool cancel_now = false;
    {
      absl::MutexLock lock(&mu_);
      ticket_ = ticket;
      cancel_now = cancelled_;
    }
    if (cancel_now && ticket != 0) service_->scheduler_->Cancel(ticket);
    Unref();
  }

  void OnCancel() override {
    Scheduler::Ticket ticket = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      ticket = ticket_;
    }
    if (ticket != 0) service_->scheduler_->Cancel(ticket);
  }

  void OnDone() override {
    service_->RpcDone();
    Unref();
  }

 private:
  void Unref() {
    if (references_.fetch_sub(1) == 1) delete this;
  }

  CloisterService* const service_;
  std::atomic<int> references_{2};  // gRPC's (until OnDone) and Infer()'s (until SetTicket)
  absl::Mutex mu_;
  Scheduler::Ticket ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
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

// UploadModel's reactor. Its handlers run one at a time (gRPC reads, then the file worker), so
// the upload's state needs no lock; only `mu_` guards what the service's idle watchdog also
// touches (whether the upload is waiting for its client, since when, and whether it is
// finished). It lives until gRPC is done with it and the watchdog has let go of it.
class CloisterService::UploadReactor : public grpc::ServerReadReactor<UploadModelRequest> {
 public:
  UploadReactor(CloisterService* service, grpc::CallbackServerContext* context,
                UploadModelResponse* response)
      : service_(service), response_(response) {
    service_->RpcStarted();
    {
      absl::MutexLock lock(&service_->uploads_mu_);
      service_->uploads_.insert(this);
    }
    absl::StatusOr<std::string> tenant = service_->Authenticate(*context, "UploadModel");
    if (!tenant.ok()) {
      state_ = State::kFinished;
      FinishOnce(tenant.status());
      return;
    }
    tenant_id_ = *std::move(tenant);
    ReadNext();
  }

  // The watchdog holds a reference while it looks at the upload.
  void Ref() { references_.fetch_add(1); }
  void Unref() {
    if (references_.fetch_sub(1) != 1) return;
    CloisterService* service = service_;
    delete this;
    service->RpcDone();
  }

  // Called by the watchdog: ends the upload with DEADLINE_EXCEEDED when it has waited longer
  // than the idle timeout for the client's next message, or is still waiting for its client
  // after the overall upload timeout.
  void EndIfOverdue(absl::Time now) {
    const absl::Duration idle = service_->options_.upload_idle_timeout;
    const absl::Duration overall = service_->options_.upload_timeout;
    absl::Status status;
    {
      // Checked and marked finished in one step: once OnReadDone has taken the message, the
      // handlers own the upload and the watchdog must not finish it under them.
      absl::MutexLock lock(&mu_);
      if (finished_ || !awaiting_client_) return;
      if (now - awaiting_since_ >= idle) {
        status = absl::DeadlineExceededError(
            absl::StrCat("upload sent nothing for ", absl::FormatDuration(idle),
                         " (limits.upload_idle_timeout_seconds); upload again"));
      } else if (now - started_ >= overall) {
        status = absl::DeadlineExceededError(absl::StrCat(
            "upload still incomplete after ", absl::FormatDuration(overall),
            " (limits.upload_timeout_seconds); nothing was stored"));
      } else {
        return;
      }
      MarkFinishedLocked();
    }
    service_->Refused("UploadModel", tenant_id_, status);
    Finish(ToGrpcStatus(status));
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      awaiting_client_ = false;
      if (finished_) return;  // ended meanwhile by the idle watchdog
    }
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
    {
      absl::MutexLock lock(&service_->uploads_mu_);
      service_->uploads_.erase(this);
    }
    {
      absl::MutexLock lock(&mu_);
      if (reserved_size_ > 0) service_->ReleaseModelMemory(tenant_id_, reserved_size_);
      reserved_size_ = 0;
    }
    upload_.reset();  // removes staged ciphertext that was not committed
    Unref();
  }

 private:
  enum class State { kExpectStart, kReceiving, kLoading, kFinished };

  // Waits for the client's next message (unless the watchdog already ended the upload).
  // StartRead under the lock: once the watchdog finishes the RPC, no read may start (gRPC runs
  // OnReadDone on its own threads, never inside StartRead).
  void ReadNext() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    awaiting_client_ = true;
    awaiting_since_ = service_->clock_->Now();
    StartRead(&request_);
  }

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
                       service_->options_.max_model_size, " bytes (limits.max_model_bytes)"));
    }
    if (status.ok()) {
      absl::StatusOr<int> worker = service_->sessions_.WorkerFor(start.session_id(), tenant_id_);
      status = worker.status();
      if (worker.ok()) worker_ = *worker;
    }
    if (status.ok()) {
      absl::StatusOr<uint64_t> budget =
          service_->ReserveModelMemory(tenant_id_, start.model_handle(), start.ciphertext_size());
      status = budget.status();
      if (budget.ok()) {
        memory_budget_ = *budget;
        absl::MutexLock lock(&mu_);
        reserved_size_ = start.ciphertext_size();
      }
    }
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
    // Tells the client its start was accepted and the declared size is held against its quota,
    // before it streams the data (a client may wait for this with WaitForInitialMetadata).
    // Sent before the next read, so the watchdog cannot have finished the RPC yet.
    StartSendInitialMetadata();
    ReadNext();
  }

  void HandleData() {
    const std::string& data = request_.data();
    if (upload_->size() + data.size() > declared_size_) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("upload sent more than its declared size of ", declared_size_, " bytes")));
      return;
    }
    absl::Status status = upload_->Append(data);
    if (!status.ok()) {
      Log(LogLevel::kError, "upload_staging_failed",
          {{"tenant", tenant_id_}, {"error", status.ToString()}});
      Fail(absl::InternalError("cloisterd cannot stage the upload"));
      return;
    }
    ReadNext();
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
      status = absl::InvalidArgumentError(absl::StrCat(
          "sealed load request of ", finish.ciphertext().size(), " bytes exceeds the limit of ",
          service_->options_.max_sealed_message_size, " bytes (limits.max_sealed_message_bytes)"));
    }
    if (!status.ok()) {
      Fail(status);
      return;
    }
    state_ = State::kLoading;
    request_id_ = finish.request_id();
    auto item = std::make_shared<SealedItem>(ToSealedItem(finish, finish.ciphertext()));
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
    load->set_model_memory_budget(memory_budget_);
    *load->mutable_request() = std::move(item);
    // The other workers get the same ciphertext once the enclave has wrapped the model key.
    if (service_->workers_.size() > 1) ciphertext_ = std::make_shared<std::string>(*ciphertext);
    load->set_model_ciphertext(*std::move(ciphertext));
    service_->workers_[worker_]->Call(std::move(call), [this](EnclaveClient::Reply reply) {
      auto shared = std::make_shared<EnclaveClient::Reply>(std::move(reply));
      service_->file_worker_.Post([this, shared] { Complete(std::move(*shared)); });
    });
  }

  // On the file worker: store the model if the enclave loaded it, then answer.
  void Complete(EnclaveClient::Reply reply) {
    if (!reply.ok()) {
      if (absl::IsFailedPrecondition(reply.status()) &&
          absl::StrContains(reply.status().message(), "re-attest")) {
        // The worker holding the upload's session died while the ciphertext streamed in (the
        // supervisor refuses the dead incarnation's session): the same answer as when it dies
        // while loading the model, and as retryable.
        Fail(absl::UnavailableError(absl::StrCat(
            "enclave worker ", worker_,
            " restarted during the upload; nothing was stored: re-attest and upload again")));
        return;
      }
      if (absl::IsUnavailable(reply.status())) {
        // The worker ended while loading: the wrapped key is committed only from its answer.
        Fail(absl::UnavailableError(absl::StrCat(
            "enclave worker ", worker_, " ended while loading the model (", reply.status().message(),
            "); nothing was stored: re-attest and upload again")));
        return;
      }
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
    std::string wrapped_key = std::move(*result.mutable_wrapped_model_key());
    if (service_->workers_.size() == 1) {
      Store(wrapped_key);
      return;
    }
    // Load it into every other worker too (its sessions may use the model), then store it.
    auto remaining =
        std::make_shared<std::atomic<int>>(static_cast<int>(service_->workers_.size()) - 1);
    auto shared_key = std::make_shared<std::string>(std::move(wrapped_key));
    for (size_t worker = 0; worker < service_->workers_.size(); ++worker) {
      if (static_cast<int>(worker) == worker_) continue;
      HostToEnclave reload;
      reload.mutable_reload_model()->set_model_handle(handle_);
      reload.mutable_reload_model()->set_wrapped_model_key(*shared_key);
      reload.mutable_reload_model()->set_model_ciphertext(*ciphertext_);
      service_->workers_[worker]->Call(
          std::move(reload), [this, worker, remaining, shared_key](EnclaveClient::Reply reply) {
            if (!reply.ok()) {
              Log(LogLevel::kWarning, "model_fanout_failed",
                  {{"tenant", tenant_id_},
                   {"handle", handle_},
                   {"worker", static_cast<int>(worker)},
                   {"error", reply.status().ToString()}});
            }
            if (remaining->fetch_sub(1) == 1) {
              service_->file_worker_.Post([this, shared_key] { Store(*shared_key); });
            }
          });
    }
  }

  // On the file worker: commit the staged model with its wrapped key and answer.
  void Store(const std::string& wrapped_key) {
    ciphertext_.reset();
    uint64_t size = upload_->size();
    absl::Status status = upload_->Commit(wrapped_key);
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
    service_->Audit(audit_event::kModelUploaded, tenant_id_, {{"handle", handle_}});
    FinishOnce(absl::OkStatus());
  }

  void Fail(const absl::Status& status) {
    service_->Refused("UploadModel", tenant_id_, status);
    upload_.reset();  // removes the staged ciphertext
    response_->Clear();
    FinishOnce(status);
  }

  // Finishes the RPC unless it is finished already (from any thread: the handlers or the
  // watchdog).
  void FinishOnce(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      MarkFinishedLocked();
    }
    Finish(ToGrpcStatus(status));
  }

  void MarkFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    // Stored or given up: either way the upload no longer holds quota of its own.
    if (reserved_size_ > 0) {
      service_->ReleaseModelMemory(tenant_id_, reserved_size_);
      reserved_size_ = 0;
    }
  }

  CloisterService* const service_;
  UploadModelResponse* const response_;
  UploadModelRequest request_;
  State state_ = State::kExpectStart;
  std::string tenant_id_;  // set in the constructor, then only read
  std::string session_id_;
  std::string handle_;
  std::string request_id_;
  uint64_t declared_size_ = 0;
  uint64_t memory_budget_ = 0;  // of the tenant's quota, for the enclave (set at the start)
  int worker_ = 0;                           // the worker holding the upload's session
  std::shared_ptr<std::string> ciphertext_;  // kept for the other workers
  std::unique_ptr<BlobUpload> upload_;

  std::atomic<int> references_{1};  // gRPC's until OnDone, plus the watchdog's while it looks
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_client_ ABSL_GUARDED_BY(mu_) = false;  // a read of the client's next message
  absl::Time awaiting_since_ ABSL_GUARDED_BY(mu_);
  const absl::Time started_ = service_->clock_->Now();
  // Of the tenant's model-memory quota; released when the RPC finishes.
  uint64_t reserved_size_ ABSL_GUARDED_BY(mu_) = 0;
};

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
      sessions_(clock_, options.session_ttl, options.max_sessions_per_tenant) {
  CLOISTER_CHECK(!workers_.empty());
  for (EnclaveClient* worker : workers_) CLOISTER_CHECK(worker != nullptr);
  CLOISTER_CHECK(options_.upload_idle_timeout > absl::ZeroDuration() &&
                 options_.upload_timeout > absl::ZeroDuration());
  upload_watchdog_ = std::thread([this] { WatchUploads(); });
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
  uint64_t stored_size = 0;
  for (const StoredModel& model : *stored) {
    // An upload under an existing handle replaces that model.
    if (model.tenant_id == tenant_id && model.handle != handle)
      stored_size += model.ciphertext_size;
  }
  absl::MutexLock lock(&quota_mu_);
  uint64_t& uploading = uploading_size_[tenant_id];
  if (stored_size + uploading + size > quota) {
    uint64_t in_progress = uploading;
    if (uploading == 0) uploading_size_.erase(tenant_id);
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", tenant_id, ": model memory quota of ", quota, " bytes exceeded (", stored_size,
        " bytes stored, ", in_progress, " being uploaded, this model ", size, " bytes)"));
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

CloisterService::~CloisterService() {
  stop_watchdog_.Notify();
  upload_watchdog_.join();
}

void CloisterService::WatchUploads() {
  // A quarter of the shorter timeout: an upload ends at most 25% late (and within a second).
  const absl::Duration period =
      std::clamp(std::min(options_.upload_idle_timeout, options_.upload_timeout) / 4,
                 absl::Milliseconds(10), absl::Seconds(1));
  while (!stop_watchdog_.WaitForNotificationWithTimeout(period)) EndOverdueUploads();
}

void CloisterService::EndOverdueUploads() {
  std::vector<UploadReactor*> uploads;
  {
    absl::MutexLock lock(&uploads_mu_);
    uploads.reserve(uploads_.size());
    for (UploadReactor* upload : uploads_) {
      upload->Ref();
      uploads.push_back(upload);
    }
  }
  const absl::Time now = clock_->Now();
  for (UploadReactor* upload : uploads) {
    upload->EndIfOverdue(now);
    upload->Unref();
  }
}

absl::StatusOr<std::string> CloisterService::Authenticate(
    const grpc::CallbackServerContext& context, absl::string_view method) const {
  RETURN_IF_ERROR(CheckAccepting());
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

absl::StatusOr<int> CloisterService::CheckSealedCall(const SealedCall& call,
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
  if (call.deadline_ms() < 0) return absl::InvalidArgumentError("deadline_ms is negative");
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
  absl::StatusOr<int> worker = CheckSealedCall(*request, *tenant, /*require_handle=*/false);
  if (!worker.ok()) {
    Refused(method, *tenant, worker.status());
    reactor->Finish(ToGrpcStatus(worker.status()));
    return reactor;
  }
  HostToEnclave call;
  boundary::v1::SealedCallMessage* message =
      is_delete ? call.mutable_delete_model() : call.mutable_list_models();
  message->set_tenant_id(*tenant);
  *message->mutable_request() = ToSealedItem(*request, request->ciphertext());
  workers_[*worker]->Call(
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
    absl::Status status = blobs_->Delete(model.tenant_id, handle);
    if (!status.ok()) {
      Log(LogLevel::kError, "model_delete_failed",
          {{"tenant", model.tenant_id}, {"handle", handle}, {"error", status.ToString()}});
    }
  }
}

grpc::ServerUnaryReactor* CloisterService::Infer(grpc::CallbackServerContext* context,
                                                 const SealedCall* request, SealedReply* response) {
  InferReactor* reactor = new InferReactor(this);
  absl::StatusOr<std::string> tenant = Authenticate(*context, "Infer");
  absl::StatusOr<int> worker = absl::UnknownError("not checked");
  if (!tenant.ok()) {
    worker = tenant.status();
  } else {
    worker = CheckSealedCall(*request, *tenant, /*require_handle=*/true);
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
      ToSealedItem(*request, std::move(*const_cast<SealedCall*>(request)->mutable_ciphertext()));
  infer.worker = *worker;
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
  std::string tenant_id = *tenant;
  Scheduler::Ticket ticket = scheduler_->Submit(
      std::move(infer), [this, reactor, response, request_id = std::move(request_id),
                         tenant_id = std::move(tenant_id)](absl::StatusOr<SealedReplyItem> reply) {
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

}  // namespace cloister::host
