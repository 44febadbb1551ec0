#include "host/server/upload_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "host/audit/audit_log.h"
#include "host/common/ids.h"
#include "host/server/cloister_service.h"
#include "host/server/sealed_relay.h"
#include "proto/error_reason.h"

namespace cloister::host {

using api::v1::SealedRequest;
using api::v1::UploadModelRequest;
using api::v1::UploadModelResponse;
using boundary::v1::HostToEnclave;
using boundary::v1::ForwardedRequest;

// ---- UploadReactor ----

UploadReactor::UploadReactor(RpcInFlight in_flight, CloisterService* service,
                             grpc::CallbackServerContext* context, UploadModelResponse* response)
    : in_flight_(std::move(in_flight)),
      service_(service),
      response_(response),
      started_(service->clock_->Now()) {
  service_->upload_watchdog_.Add(this);
  absl::StatusOr<std::string> tenant = service_->Authenticate(*context, "UploadModel");
  if (!tenant.ok()) {
    state_ = State::kFinished;
    FinishOnce(tenant.status());
    return;
  }
  tenant_id_ = *std::move(tenant);
  ReadNext();
}

void UploadReactor::Unref() {
  if (references_.fetch_sub(1) == 1) delete this;
}

void UploadReactor::EndIfOverdue(absl::Time now) {
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
      status = absl::DeadlineExceededError(
          absl::StrCat("upload still incomplete after ", absl::FormatDuration(overall),
                       " (limits.upload_timeout_seconds); nothing was stored"));
    } else {
      return;
    }
    MarkFinishedLocked();
  }
  service_->Refused("UploadModel", tenant_id_, status);
  Finish(ToGrpcStatus(status));
}

void UploadReactor::OnReadDone(bool ok) {
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

void UploadReactor::OnDone() {
  service_->upload_watchdog_.Remove(this);
  {
    absl::MutexLock lock(&mu_);
    if (reserved_size_ > 0) service_->ReleaseModelMemory(tenant_id_, reserved_size_);
    reserved_size_ = 0;
  }
  upload_.reset();  // removes staged ciphertext that was not committed
  Unref();
}

// StartRead under the lock: once the watchdog finishes the RPC, no read may start (gRPC runs
// OnReadDone on its own threads, never inside StartRead).
void UploadReactor::ReadNext() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  awaiting_client_ = true;
  awaiting_since_ = service_->clock_->Now();
  StartRead(&request_);
}

void UploadReactor::HandleStart() {
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

void UploadReactor::HandleData() {
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

void UploadReactor::HandleFinish() {
  SealedRequest& finish = *request_.mutable_finish();
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
  auto item = std::make_shared<ForwardedRequest>(ToForwardedRequest(finish, finish.ciphertext()));
  service_->file_worker_.Post([this, item] { SendToEnclave(std::move(*item)); });
}

void UploadReactor::SendToEnclave(boundary::v1::ForwardedRequest item) {
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

void UploadReactor::Complete(EnclaveClient::Reply reply) {
  if (!reply.ok()) {
    if (proto::ReasonOf(reply.status()) == api::v1::SESSION_LOST) {
      // The worker holding the upload's session died while the ciphertext streamed in (the
      // supervisor refuses the dead incarnation's session): the same answer as when it dies
      // while loading the model, and as retryable.
      Fail(proto::WithReason(
          absl::UnavailableError(absl::StrCat(
              "enclave worker ", worker_,
              " restarted during the upload; nothing was stored: re-attest and upload again")),
          api::v1::NOTHING_STORED));
      return;
    }
    if (absl::IsUnavailable(reply.status())) {
      // The worker ended while loading: the wrapped key is committed only from its answer.
      Fail(proto::WithReason(
          absl::UnavailableError(absl::StrCat("enclave worker ", worker_,
                                              " ended while loading the model (",
                                              reply.status().message(),
                                              "); nothing was stored: re-attest and upload again")),
          api::v1::NOTHING_STORED));
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
  memory_size_ = result.model_memory_size();
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

void UploadReactor::Store(const std::string& wrapped_key) {
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
  // From now on the model counts against the quota with the size the enclave reported.
  service_->RecordModelMemory(tenant_id_, handle_, memory_size_);
  Log(LogLevel::kInfo, "model_stored",
      {{"tenant", tenant_id_}, {"handle", handle_}, {"size", static_cast<unsigned long>(size)}});
  service_->Audit(audit_event::kModelUploaded, tenant_id_, {{"handle", handle_}});
  FinishOnce(absl::OkStatus());
}

void UploadReactor::Fail(const absl::Status& status) {
  service_->Refused("UploadModel", tenant_id_, status);
  upload_.reset();  // removes the staged ciphertext
  response_->Clear();
  FinishOnce(status);
}

void UploadReactor::FinishOnce(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    MarkFinishedLocked();
  }
  Finish(ToGrpcStatus(status));
}

void UploadReactor::MarkFinishedLocked() {
  finished_ = true;
  // Stored or given up: either way the upload no longer holds quota of its own.
  if (reserved_size_ > 0) {
    service_->ReleaseModelMemory(tenant_id_, reserved_size_);
    reserved_size_ = 0;
  }
}

// ---- UploadWatchdog ----

UploadWatchdog::UploadWatchdog(Clock* clock, absl::Duration idle_timeout,
                               absl::Duration overall_timeout)
    : clock_(clock) {
  const absl::Duration period = std::clamp(std::min(idle_timeout, overall_timeout) / 4,
                                           absl::Milliseconds(10), absl::Seconds(1));
  thread_ = std::thread([this, period] { Loop(period); });
}

UploadWatchdog::~UploadWatchdog() {
  stop_.Notify();
  thread_.join();
}

void UploadWatchdog::Add(UploadReactor* upload) {
  absl::MutexLock lock(&mu_);
  uploads_.insert(upload);
}

void UploadWatchdog::Remove(UploadReactor* upload) {
  absl::MutexLock lock(&mu_);
  uploads_.erase(upload);
}

void UploadWatchdog::Loop(absl::Duration period) {
  while (!stop_.WaitForNotificationWithTimeout(period)) EndOverdueUploads();
}

void UploadWatchdog::EndOverdueUploads() {
  std::vector<UploadReactor*> uploads;
  {
    absl::MutexLock lock(&mu_);
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

}  // namespace cloister::host
