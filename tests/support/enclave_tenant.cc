#include "tests/support/enclave_tenant.h"

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "base/status.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/hpke.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"

namespace cloister::testing {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::ForwardedRequest;

EnclaveTenant::EnclaveTenant(enclave::Enclave* enclave, std::string tenant,
                             const attest::v1::Policy& policy, absl::Time at)
    : enclave_(enclave), tenant_(std::move(tenant)), identity_(crypto::GenerateEd25519()) {
  Bytes nonce = crypto::RandomBytes(32);
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce(ToString(nonce));
  EnclaveToHost reply = enclave_->Handle(call);
  if (reply.status().code() != 0) {
    attestation_ = absl::UnavailableError(absl::StrCat("evidence: ", reply.status().message()));
    return;
  }
  attest::v1::ChallengeResponse challenge;
  if (!challenge.ParseFromString(reply.get_evidence().challenge_response())) {
    attestation_ = absl::DataLossError("evidence: not a ChallengeResponse");
    return;
  }
  auto verdict = attest::VerifyChallenge(challenge, nonce, policy, at);
  if (!verdict.ok()) {
    attestation_ = verdict.status();
  } else if (!verdict->pass) {
    attestation_ = absl::PermissionDeniedError(verdict->FailedSummary());
  } else {
    verdict_ = *verdict;
  }
}

absl::Status EnclaveTenant::SignHello(api::v1::SessionHello& hello, ByteSpan enc) const {
  hello.set_identity_public_key(ToString(identity_.public_key));
  Bytes transcript = crypto::SessionTranscript(
      verdict_.evidence_digest, verdict_.enclave_hpke_public_key,
      verdict_.enclave_signing_public_key, identity_.public_key, enc,
      AsBytes(hello.client_nonce()), hello.tenant_id());
  ASSIGN_OR_RETURN(Bytes signature, crypto::Ed25519Sign(identity_.seed.span(), transcript));
  hello.set_transcript_signature(ToString(signature));
  return absl::OkStatus();
}

absl::StatusOr<EnclaveTenant::PendingOpen> EnclaveTenant::StartOpen(
    const std::function<std::string(api::v1::SessionHello&, ByteSpan enc)>& edit) {
  RETURN_IF_ERROR(attestation_);
  ASSIGN_OR_RETURN(auto setup,
                   crypto::HpkeSetupSender(crypto::kSessionSuite, verdict_.enclave_hpke_public_key,
                                           crypto::SessionHpkeInfo(verdict_.evidence_digest)));
  api::v1::SessionHello hello;
  hello.set_tenant_id(tenant_);
  hello.set_client_nonce(ToString(crypto::RandomBytes(32)));
  RETURN_IF_ERROR(SignHello(hello, setup.enc));
  const std::string plaintext = edit ? edit(hello, setup.enc) : hello.SerializeAsString();
  ASSIGN_OR_RETURN(Bytes sealed, setup.context->Seal(AsBytes(tenant_), AsBytes(plaintext)));
  PendingOpen pending;
  auto* open = pending.call.mutable_open_session();
  open->set_tenant_id(tenant_);
  open->set_hpke_enc(ToString(setup.enc));
  open->set_sealed_hello(ToString(sealed));
  open->set_evidence_digest(ToString(verdict_.evidence_digest));
  pending.context = std::move(setup.context);
  pending.enc = std::move(setup.enc);
  return pending;
}

absl::Status EnclaveTenant::FinishOpen(PendingOpen& pending, const EnclaveToHost& reply) {
  if (reply.status().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.status().code()),
                        reply.status().message());
  }
  ASSIGN_OR_RETURN(auto keys, crypto::DeriveChannelKeys(*pending.context));
  auto sender = std::make_unique<crypto::ChannelSender>(
      keys.session_id, crypto::Direction::kClientToEnclave, keys.client_to_enclave_key.span(),
      keys.client_to_enclave_nonce.span());
  auto receiver = std::make_unique<crypto::ChannelReceiver>(
      keys.session_id, crypto::Direction::kEnclaveToClient, keys.enclave_to_client_key.span(),
      keys.enclave_to_client_nonce.span());
  RETURN_IF_ERROR(receiver
                      ->Open(reply.open_session().sequence(),
                             {crypto::MessageKind::kWelcome, "", ""},
                             AsBytes(reply.open_session().sealed_welcome()))
                      .status());
  session_id_ = keys.session_id;
  sender_ = std::move(sender);
  receiver_ = std::move(receiver);
  return absl::OkStatus();
}

absl::Status EnclaveTenant::Open() {
  ASSIGN_OR_RETURN(PendingOpen pending, StartOpen());
  return FinishOpen(pending, enclave_->Handle(pending.call));
}

ForwardedRequest EnclaveTenant::Seal(crypto::MessageKind kind, const std::string& handle,
                               const google::protobuf::Message& body) {
  return SealBytes(kind, handle, AsBytes(body.SerializeAsString()));
}

ForwardedRequest EnclaveTenant::SealBytes(crypto::MessageKind kind, const std::string& handle,
                                    ByteSpan plaintext) {
  std::string request_id = HexEncode(crypto::RandomBytes(8));
  ForwardedRequest item;
  item.set_session_id(ToString(session_id_));
  item.set_request_id(request_id);
  item.set_model_handle(handle);
  if (sender_ == nullptr) return item;  // no session: an item the enclave will refuse
  auto sealed = sender_->Seal({kind, request_id, handle}, plaintext);
  if (sealed.ok()) {
    item.set_sequence(sealed->first);
    item.set_ciphertext(ToString(sealed->second));
  }
  return item;
}

absl::StatusOr<api::v1::ReplyEnvelope> EnclaveTenant::OpenReplyEnvelope(
    crypto::MessageKind kind, const ForwardedRequest& request,
    const boundary::v1::EnclaveReply& reply) {
  if (reply.status().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.status().code()),
                        absl::StrCat("unsealed: ", reply.status().message()));
  }
  if (receiver_ == nullptr) return absl::FailedPreconditionError("no session is open");
  ASSIGN_OR_RETURN(Bytes plain,
                   receiver_->Open(reply.sequence(),
                                   {kind, request.request_id(), request.model_handle()},
                                   AsBytes(reply.ciphertext())));
  api::v1::ReplyEnvelope envelope;
  if (!envelope.ParseFromArray(plain.data(), static_cast<int>(plain.size()))) {
    return absl::DataLossError("the reply is not a ReplyEnvelope");
  }
  return envelope;
}

absl::Status EnclaveTenant::OpenReply(crypto::MessageKind kind, const ForwardedRequest& request,
                                      const boundary::v1::EnclaveReply& reply,
                                      std::string* body) {
  ASSIGN_OR_RETURN(api::v1::ReplyEnvelope envelope, OpenReplyEnvelope(kind, request, reply));
  if (body) *body = envelope.body();
  return absl::Status(static_cast<absl::StatusCode>(envelope.code()), envelope.message());
}

absl::StatusOr<api::v1::GenerateChunk> EnclaveTenant::OpenChunk(
    const ForwardedRequest& request, const boundary::v1::GenerateResult& result) {
  if (receiver_ == nullptr) return absl::FailedPreconditionError("no session is open");
  ASSIGN_OR_RETURN(Bytes plain,
                   receiver_->Open(result.sequence(),
                                   {crypto::MessageKind::kGenerateChunk, request.request_id(),
                                    request.model_handle(), result.chunk(), result.final()},
                                   AsBytes(result.ciphertext())));
  api::v1::GenerateChunk chunk;
  if (!chunk.ParseFromArray(plain.data(), static_cast<int>(plain.size()))) {
    return absl::DataLossError("the chunk is not a GenerateChunk");
  }
  return chunk;
}

std::string EnclaveTenant::Handle(const std::string& name) const {
  return crypto::ModelHandle(identity_.public_key, name);
}

HostToEnclave EnclaveTenant::LoadCall(const std::string& name, const std::string& model_bytes,
                                      const std::function<void(Bytes&)>& damage) {
  std::string handle = Handle(name);
  SecretBytes key = crypto::RandomSecret(32);
  auto ciphertext = crypto::ChunkedEncrypt(key.span(), crypto::ModelEncryptionContext(handle),
                                           AsBytes(model_bytes));
  Bytes encrypted = ciphertext.ok() ? *std::move(ciphertext) : Bytes();
  if (damage) damage(encrypted);
  api::v1::LoadModelRequest request;
  request.set_name(name);
  request.set_model_key(ToString(key.span()));
  request.set_plaintext_sha256(ToString(crypto::Sha256(AsBytes(model_bytes))));
  request.set_plaintext_size(model_bytes.size());
  HostToEnclave call;
  auto* load = call.mutable_load_model();
  load->set_tenant_id(tenant_);
  *load->mutable_request() = Seal(crypto::MessageKind::kLoadModel, handle, request);
  load->set_model_ciphertext(ToString(encrypted));
  return call;
}

void CapturedFrames::Write(const boundary::v1::EnclaveToHost& frame) {
  absl::MutexLock lock(&mu_);
  frames_.push_back(frame);
  times_.push_back(absl::Now());
}

std::vector<boundary::v1::EnclaveToHost> CapturedFrames::Frames() {
  absl::MutexLock lock(&mu_);
  return frames_;
}

std::vector<absl::Time> CapturedFrames::Times(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  std::vector<absl::Time> out;
  for (size_t i = 0; i < frames_.size(); ++i) {
    if (frames_[i].call_id() == call_id) out.push_back(times_[i]);
  }
  return out;
}

std::vector<boundary::v1::EnclaveToHost> CapturedFrames::OfLocked(uint64_t call_id) {
  std::vector<boundary::v1::EnclaveToHost> out;
  for (const auto& frame : frames_) {
    if (frame.call_id() == call_id) out.push_back(frame);
  }
  return out;
}

absl::StatusOr<std::vector<boundary::v1::EnclaveToHost>> CapturedFrames::WaitForEnd(
    uint64_t call_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& frame : frames_) {
      if (frame.call_id() == call_id &&
          (frame.status().code() != 0 || frame.generate().final())) {
        return true;
      }
    }
    return false;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("call ", call_id, " did not end in ",
                                                    absl::FormatDuration(timeout), "; ",
                                                    OfLocked(call_id).size(), " frames came"));
  }
  return OfLocked(call_id);
}

absl::Status CapturedFrames::WaitForAny(uint64_t call_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto any = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !OfLocked(call_id).empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&any), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("no frame of call ", call_id, " came in ",
                                                    absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace cloister::testing
