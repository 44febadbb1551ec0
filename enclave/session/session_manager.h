// Sessions inside the enclave (docs/PROTOCOL.md section 3): opens sealed hellos against the
// enclave's HPKE key and current evidence, checks the tenant's transcript signature, keeps the
// per-session channel state (sequence numbers, replay window, expiry) and seals replies.
//
// Thread-safe: the session table is guarded by a mutex; each Session guards its own channel
// state, so calls on different sessions run in parallel.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "base/secret_bytes.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "crypto/channel.h"

namespace cloister::enclave {

struct SessionLimits {
  absl::Duration lifetime = absl::Hours(1);
  uint64_t max_messages = uint64_t{1} << 32;
  size_t max_sessions = 4096;
};

class Session {
 public:
  Session(crypto::ChannelKeys keys, std::string tenant_id, Bytes identity_public_key,
          absl::Time expires_at);

  const Bytes& id() const { return id_; }
  const std::string& tenant_id() const { return tenant_id_; }
  const Bytes& identity_public_key() const { return identity_public_key_; }
  absl::Time expires_at() const { return expires_at_; }

  // Opens a client-to-enclave message in place (crypto::ChannelReceiver::OpenInPlace): returns
  // the plaintext's size at the start of `message`. PermissionDenied for replays; a message that
  // fails authentication changes no state. On failure `message` is wiped.
  absl::StatusOr<size_t> OpenInPlace(uint64_t sequence, const crypto::MessageHeader& header,
                                     std::span<uint8_t> message, uint64_t max_messages)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Seals an enclave-to-client message in place (crypto::ChannelSender::SealInPlace); returns
  // the sequence number.
  absl::StatusOr<uint64_t> SealInPlace(const crypto::MessageHeader& header,
                                       std::span<uint8_t> message) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Bytes id_;
  const std::string tenant_id_;
  const Bytes identity_public_key_;
  const absl::Time expires_at_;
  absl::Mutex mu_;
  crypto::ChannelReceiver receiver_ ABSL_GUARDED_BY(mu_);
  crypto::ChannelSender sender_ ABSL_GUARDED_BY(mu_);
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;
};

// The enclave's long-term session keys, as attested in its evidence.
struct EnclaveKeys {
  SecretBytes hpke_private_key;
  Bytes hpke_public_key;
  SecretBytes signing_seed;
  Bytes signing_public_key;

  // Fresh HPKE and signing keys, for one enclave lifetime.
  static EnclaveKeys Generate();
};

class SessionManager {
 public:
  SessionManager(const EnclaveKeys* keys, Clock* clock, SessionLimits limits = {});

  // Opens a session for `tenant_id` (as the host authenticated it) over evidence whose digest
  // the caller has checked is current. Errors name what was wrong: bad HPKE ciphertext, tenant
  // mismatch, bad transcript signature, too many sessions.
  absl::StatusOr<boundary::v1::OpenSessionResult> Open(const std::string& tenant_id,
                                                       ByteSpan hpke_enc, ByteSpan sealed_hello,
                                                       ByteSpan evidence_digest)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finds a live session. NotFound("unknown or expired session; open a new session") otherwise.
  absl::StatusOr<std::shared_ptr<Session>> Find(ByteSpan session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Opens one sealed item of `kind` for `tenant_id`: the session must exist, belong to that
  // tenant, and the message must authenticate and not be a replay. Opened in place in the
  // item's ciphertext field: `plaintext` views the start of that field, which the caller wipes
  // (proto::WipeString) when done. On failure the field is wiped when it was opened at all.
  struct Opened {
    std::shared_ptr<Session> session;
    ByteSpan plaintext;
  };
  absl::StatusOr<Opened> OpenItem(boundary::v1::ForwardedRequest& item, crypto::MessageKind kind,
                                  const std::string& tenant_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Seals a ReplyEnvelope for `item` (same request id and model handle, kind of the call).
  // Takes the envelope and wipes it, and its serialized copy, once sealed: the reply's
  // plaintext does not outlive the call.
  boundary::v1::EnclaveReply SealReply(Session& session, const boundary::v1::ForwardedRequest& item,
                                          crypto::MessageKind kind,
                                          api::v1::ReplyEnvelope envelope);

  size_t session_count() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DropExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The item's session when it belongs to `tenant_id`; NotFound (as for an unknown session)
  // otherwise.
  absl::StatusOr<std::shared_ptr<Session>> ItemSession(const boundary::v1::ForwardedRequest& item,
                                                       const std::string& tenant_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  const EnclaveKeys* keys_;
  Clock* clock_;
  const SessionLimits limits_;
  absl::Mutex mu_;
  std::map<Bytes, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

// Wraps a status, and with an OK status the reply `body`, into the envelope sealed back to the
// client. The body is serialized straight into the envelope and then wiped (proto/wipe.h): its
// plaintext lives on only in the envelope, which SealReply wipes once sealed.
api::v1::ReplyEnvelope MakeEnvelope(const absl::Status& status,
                                    google::protobuf::Message* body = nullptr);

}  // namespace cloister::enclave
