#include "enclave/session/session_manager.h"

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "proto/error_reason.h"
#include "proto/sealing.h"
#include "proto/wipe.h"

namespace cloister::enclave {

EnclaveKeys EnclaveKeys::Generate() {
  crypto::X25519KeyPair hpke = crypto::GenerateX25519();
  crypto::Ed25519KeyPair signing = crypto::GenerateEd25519();
  EnclaveKeys keys;
  keys.hpke_private_key = std::move(hpke.private_key);
  keys.hpke_public_key = hpke.public_key;
  keys.signing_seed = std::move(signing.seed);
  keys.signing_public_key = signing.public_key;
  return keys;
}

using boundary::v1::ForwardedRequest;
using boundary::v1::EnclaveReply;

Session::Session(crypto::ChannelKeys keys, std::string tenant_id, Bytes identity_public_key,
                 absl::Time expires_at)
    : id_(keys.session_id),
      tenant_id_(std::move(tenant_id)),
      identity_public_key_(std::move(identity_public_key)),
      expires_at_(expires_at),
      receiver_(keys.session_id, crypto::Direction::kClientToEnclave,
                keys.client_to_enclave_key.span(), keys.client_to_enclave_nonce.span()),
      sender_(keys.session_id, crypto::Direction::kEnclaveToClient,
              keys.enclave_to_client_key.span(), keys.enclave_to_client_nonce.span()) {}

absl::StatusOr<size_t> Session::OpenInPlace(uint64_t sequence, const crypto::MessageHeader& header,
                                            std::span<uint8_t> message, uint64_t max_messages) {
  absl::MutexLock lock(&mu_);
  if (received_ >= max_messages) {
    return absl::FailedPreconditionError("session message limit reached; open a new session");
  }
  ASSIGN_OR_RETURN(size_t size, receiver_.OpenInPlace(sequence, header, message));
  ++received_;
  return size;
}

absl::StatusOr<uint64_t> Session::SealInPlace(const crypto::MessageHeader& header,
                                              std::span<uint8_t> message) {
  absl::MutexLock lock(&mu_);
  return sender_.SealInPlace(header, message);
}

SessionManager::SessionManager(const EnclaveKeys* keys, Clock* clock, SessionLimits limits)
    : keys_(keys), clock_(clock), limits_(limits) {}

absl::StatusOr<boundary::v1::OpenSessionResult> SessionManager::Open(
    const std::string& tenant_id, ByteSpan hpke_enc, ByteSpan sealed_hello,
    ByteSpan evidence_digest) {
  if (tenant_id.empty()) return absl::InvalidArgumentError("open session: empty tenant id");
  if (hpke_enc.size() != crypto::kX25519KeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("open session: HPKE encapsulated key is ", hpke_enc.size(), " bytes, not 32"));
  }
  Bytes info = crypto::SessionHpkeInfo(evidence_digest);
  auto context = crypto::HpkeSetupReceiver(crypto::kSessionSuite, hpke_enc,
                                           keys_->hpke_private_key.span(), info);
  if (!context.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("open session: bad HPKE encapsulation: ", context.status().message()));
  }
  auto hello_bytes = (*context)->Open(AsBytes(tenant_id), sealed_hello);
  if (!hello_bytes.ok()) {
    return absl::PermissionDeniedError(
        "open session: sealed hello does not authenticate (wrong enclave key, evidence or tenant)");
  }
  api::v1::SessionHello hello;
  if (!hello.ParseFromArray(hello_bytes->data(), static_cast<int>(hello_bytes->size()))) {
    return absl::InvalidArgumentError("open session: malformed hello");
  }
  if (hello.tenant_id() != tenant_id) {
    return absl::PermissionDeniedError("open session: hello names another tenant than the caller");
  }
  if (hello.identity_public_key().size() != crypto::kEd25519PublicKeySize) {
    return absl::InvalidArgumentError("open session: identity key must be 32 bytes (Ed25519)");
  }
  Bytes identity(hello.identity_public_key().begin(), hello.identity_public_key().end());
  Bytes transcript = crypto::SessionTranscript(
      evidence_digest, keys_->hpke_public_key, keys_->signing_public_key, identity, hpke_enc,
      AsBytes(hello.client_nonce()), tenant_id);
  if (!crypto::Ed25519Verify(identity, transcript, AsBytes(hello.transcript_signature())).ok()) {
    return absl::PermissionDeniedError(
        "open session: transcript signature does not verify with the identity key");
  }
  ASSIGN_OR_RETURN(crypto::ChannelKeys keys, crypto::DeriveChannelKeys(**context));
  absl::Time expires = clock_->Now() + limits_.lifetime;
  auto session = std::make_shared<Session>(std::move(keys), tenant_id, identity, expires);

  {
    absl::MutexLock lock(&mu_);
    DropExpiredLocked();
    if (sessions_.size() >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "open session: the enclave holds its maximum of ", limits_.max_sessions, " sessions"));
    }
    if (sessions_.count(session->id())) {
      return absl::AlreadyExistsError("open session: session already open (replayed hello)");
    }
    sessions_[session->id()] = session;
  }

  api::v1::Welcome welcome;
  welcome.set_session_id(ToString(session->id()));
  welcome.set_expires_at_unix(absl::ToUnixSeconds(expires));
  welcome.set_max_messages(limits_.max_messages);
  crypto::MessageHeader header{crypto::MessageKind::kWelcome, "", ""};
  boundary::v1::OpenSessionResult result;
  ASSIGN_OR_RETURN(std::span<uint8_t> message,
                   proto::SerializeForSealing(welcome, *result.mutable_sealed_welcome()));
  ASSIGN_OR_RETURN(uint64_t sequence, session->SealInPlace(header, message));
  result.set_session_id(ToString(session->id()));
  result.set_sequence(sequence);
  Log(LogLevel::kInfo, "session_opened",
      {{"tenant", tenant_id}, {"session", HexEncode(session->id()).substr(0, 8)}});
  return result;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Find(ByteSpan session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(Bytes(session_id.begin(), session_id.end()));
  if (it == sessions_.end() || it->second->expires_at() <= clock_->Now()) {
    if (it != sessions_.end()) sessions_.erase(it);
    return absl::NotFoundError("unknown or expired session; open a new session");
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::ItemSession(
    const ForwardedRequest& item, const std::string& tenant_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(AsBytes(item.session_id())));
  if (session->tenant_id() != tenant_id) {
    // The host vouched for another tenant: refuse exactly as an unknown session.
    return absl::NotFoundError("unknown or expired session; open a new session");
  }
  return session;
}

absl::StatusOr<SessionManager::Opened> SessionManager::OpenItem(ForwardedRequest& item,
                                                                crypto::MessageKind kind,
                                                                const std::string& tenant_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, ItemSession(item, tenant_id));
  crypto::MessageHeader header{kind, item.request_id(), item.model_handle()};
  std::string& buffer = *item.mutable_ciphertext();
  auto* data = reinterpret_cast<uint8_t*>(buffer.data());
  ASSIGN_OR_RETURN(size_t size,
                   session->OpenInPlace(item.sequence(), header,
                                        std::span<uint8_t>(data, buffer.size()),
                                        limits_.max_messages));
  return Opened{std::move(session), ByteSpan(data, size)};
}

EnclaveReply SessionManager::SealReply(Session& session, const ForwardedRequest& item,
                                          crypto::MessageKind kind,
                                          api::v1::ReplyEnvelope envelope) {
  EnclaveReply reply;
  reply.set_request_id(item.request_id());
  crypto::MessageHeader header{kind, item.request_id(), item.model_handle()};
  // Serialized straight into the reply's ciphertext field and sealed there in place.
  std::string& buffer = *reply.mutable_ciphertext();
  absl::StatusOr<std::span<uint8_t>> message = proto::SerializeForSealing(envelope, buffer);
  proto::WipeMessage(envelope);
  absl::StatusOr<uint64_t> sequence =
      message.ok() ? session.SealInPlace(header, *message) : message.status();
  if (!sequence.ok()) {
    proto::WipeString(buffer);
    reply.clear_ciphertext();
    proto::SetBoundaryStatus(sequence.status(), *reply.mutable_status());
    return reply;
  }
  reply.set_sequence(*sequence);
  return reply;
}

size_t SessionManager::session_count() {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionManager::DropExpiredLocked() {
  absl::Time now = clock_->Now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->expires_at() <= now) {
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

api::v1::ReplyEnvelope MakeEnvelope(const absl::Status& status, google::protobuf::Message* body) {
  api::v1::ReplyEnvelope envelope;
  envelope.set_code(static_cast<int>(status.code()));
  envelope.set_message(std::string(status.message()));
  envelope.set_reason(proto::ReasonOf(status));
  if (body != nullptr) {
    if (status.ok()) body->SerializeToString(envelope.mutable_body());
    proto::WipeMessage(*body);
  }
  return envelope;
}

}  // namespace cloister::enclave
