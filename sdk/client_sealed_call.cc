// Client (client.h): the sealed unary calls (docs/PROTOCOL.md section 5): sealing a request,
// opening its ReplyEnvelope, and the retries and failover of idempotent calls (Generate's too).
#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/duration.h"
#include "proto/error_reason.h"
#include "sdk/client.h"
#include "sdk/client_internal.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

namespace client_internal {

absl::Status EnclaveError(int code, const std::string& message, api::ErrorReason reason) {
  auto status_code =
      (code > 0 && code <= 16) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return proto::WithReason(
      absl::Status(status_code,
                   message.empty()
                       ? absl::StrCat("the enclave refused the request (code ", code, ")")
                       : message),
      reason);
}

absl::Status OpenReply(crypto::ChannelReceiver& receiver, const crypto::MessageHeader& header,
                       api::SealedReply& sealed, google::protobuf::Message& reply) {
  std::string& buffer = *sealed.mutable_ciphertext();
  auto* data = reinterpret_cast<uint8_t*>(buffer.data());
  auto size = receiver.OpenInPlace(sealed.sequence(), header,
                                   std::span<uint8_t>(data, buffer.size()));
  if (!size.ok()) {
    return absl::DataLossError(absl::StrCat("cannot open the enclave's reply to request ",
                                            header.request_id, ": ", size.status().message()));
  }
  api::ReplyEnvelope envelope;
  bool parsed = envelope.ParseFromArray(data, static_cast<int>(*size));
  WipeString(buffer);
  if (!parsed) return absl::DataLossError("the enclave's reply is not a ReplyEnvelope");
  if (envelope.code() != 0) {
    return EnclaveError(envelope.code(), envelope.message(), envelope.reason());
  }
  bool body_parsed = reply.ParseFromString(envelope.body());
  WipeString(*envelope.mutable_body());
  if (!body_parsed) {
    return absl::DataLossError(
        absl::StrCat("the enclave's reply body is not a ", reply.GetDescriptor()->name()));
  }
  return absl::OkStatus();
}

bool IsRetryable(const absl::Status& status) {
  if (absl::IsUnavailable(status)) return true;
  const api::ErrorReason reason = proto::ReasonOf(status);
  return reason == api::SESSION_LOST || reason == api::EVIDENCE_STALE;
}

}  // namespace client_internal

using client_internal::FromGrpc;
using client_internal::IsRetryable;
using client_internal::NewRequestId;
using client_internal::OpenReply;
using client_internal::PrepareContext;
using client_internal::StringOf;
using client_internal::WipeString;

absl::Status Client::CallWithRetries(const Attempt& attempt, const std::function<bool()>& may_retry,
                                     bool names_model) {
  const int attempts = std::max(1, options_.max_attempts);
  // Each failover gives the call a fresh budget of attempts on the next node; a call moves
  // across each other node at most once.
  size_t failovers_left = endpoints_.size() - 1;
  absl::Duration pause = options_.retry_backoff;
  for (int tried = 1;; ++tried) {
    std::shared_ptr<Session> used;
    absl::Status status = attempt(used);
    if (names_model && absl::IsNotFound(status) && used != nullptr && endpoints_.size() > 1) {
      // Models live in one node's store; say which node lacks it.
      return absl::NotFoundError(absl::StrCat(
          status.message(), " (on ", endpoints_[used->endpoint].address,
          "; each node keeps its own models: upload the model to every endpoint the client "
          "may move to)"));
    }
    if (status.ok() || !IsRetryable(status)) return status;
    const bool retry = may_retry();
    if (!retry || tried >= attempts) {
      // This node's budget is spent: a call that may be retried moves on to the next node. Any
      // call leaves the session behind, so the next call attests again (and moves on when the
      // node is down).
      if (used != nullptr) DropSession(used);
      if (!retry || used == nullptr || failovers_left == 0) return status;
      if (!FailOver(used->endpoint)) return status;
      --failovers_left;
      tried = 0;
      pause = options_.retry_backoff;
      continue;
    }
    if (used != nullptr) DropSession(used);
    absl::SleepFor(pause);
    pause *= 2;
  }
}

absl::Status Client::SealedUnaryCall(crypto::MessageKind kind, const std::string& model_handle,
                                     const Serializer& serialize, google::protobuf::Message& reply,
                                     absl::Duration timeout) {
  const bool idempotent =
      kind == crypto::MessageKind::kInfer || kind == crypto::MessageKind::kListModels;
  return CallWithRetries(
      [&](std::shared_ptr<Session>& used) {
        reply.Clear();
        return SealedUnaryCallOnce(kind, model_handle, serialize, reply, timeout, used);
      },
      [idempotent] { return idempotent; },
      /*names_model=*/kind == crypto::MessageKind::kInfer ||
          kind == crypto::MessageKind::kDeleteModel);
}

absl::Status Client::SealedUnaryCallOnce(crypto::MessageKind kind, const std::string& model_handle,
                                         const Serializer& serialize,
                                         google::protobuf::Message& reply, absl::Duration timeout,
                                         std::shared_ptr<Session>& used) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  used = session;
  crypto::MessageHeader header{kind, NewRequestId(), model_handle};
  api::SealedRequest call;
  {
    // The request is serialized straight into the call's ciphertext field and sealed there in
    // place: no second copy of the plaintext to allocate, fill and wipe.
    std::string& buffer = *call.mutable_ciphertext();
    ASSIGN_OR_RETURN(std::span<uint8_t> message, serialize(buffer));
    absl::MutexLock lock(&session->mu);
    auto sequence = session->sender->SealInPlace(header, message);
    if (!sequence.ok()) {
      WipeString(buffer);
      return sequence.status();
    }
    call.set_sequence(*sequence);
  }
  call.set_session_id(StringOf(session->id));
  call.set_request_id(header.request_id);
  call.set_model_handle(model_handle);
  if (kind == crypto::MessageKind::kInfer) {
    absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options_.call_timeout;
    *call.mutable_deadline() = proto::ToProtoDuration(limit);
  }

  api::Cloister::Stub& stub = *endpoints_[session->endpoint].stub;
  api::SealedReply sealed_reply;
  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/true, timeout);
  grpc::Status status;
  absl::string_view rpc;
  switch (kind) {
    case crypto::MessageKind::kInfer:
      rpc = "Infer";
      status = stub.Infer(&context, call, &sealed_reply);
      break;
    case crypto::MessageKind::kListModels:
      rpc = "ListModels";
      status = stub.ListModels(&context, call, &sealed_reply);
      break;
    case crypto::MessageKind::kDeleteModel:
      rpc = "DeleteModel";
      status = stub.DeleteModel(&context, call, &sealed_reply);
      break;
    default:
      CLOISTER_CHECK(false && "not a unary sealed call");
  }
  if (!status.ok()) {
    return FromGrpc(status, rpc, endpoints_[session->endpoint].address, options_, timeout);
  }
  absl::MutexLock lock(&session->mu);
  return OpenReply(*session->receiver, header, sealed_reply, reply);
}

}  // namespace cloister::sdk
