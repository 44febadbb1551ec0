// Test support: a tenant's side of a session with an in-process enclave (enclave/enclave.h),
// built from the same crypto primitives as the SDK, for tests and fuzz targets that speak the
// boundary calls exactly as cloisterd relays them: attest (evidence over a fresh nonce checked
// against a policy), open a session, seal calls, open sealed replies, and build model loads.
// Not thread-safe; one owner. Keeps a pointer to the enclave, which must outlive it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attest/verifier.h"
#include "base/bytes.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/attest/v1/policy.pb.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "crypto/channel.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "enclave/enclave.h"
#include "google/protobuf/message.h"

namespace cloister::testing {

class EnclaveTenant {
 public:
  // Asks `enclave` for evidence over a fresh nonce and verifies it against `policy` at `at`;
  // attestation() says how that went.
  EnclaveTenant(enclave::Enclave* enclave, std::string tenant, const attest::v1::Policy& policy,
                absl::Time at = absl::Now());
  virtual ~EnclaveTenant() = default;

  const absl::Status& attestation() const { return attestation_; }

  // Opens a session (HPKE to the attested key, signed transcript) and checks the welcome.
  absl::Status Open();

  // Open() in two halves, for tests and fuzz targets that alter the hello: StartOpen builds the
  // OpenSessionCall; `edit`, when given, turns the genuine hello into the plaintext that is
  // sealed instead (a hello it edits can be signed again with SignHello). FinishOpen takes
  // the enclave's answer and, when it is a welcome that opens, makes the session current.
  struct PendingOpen {
    boundary::v1::HostToEnclave call;
    std::unique_ptr<crypto::HpkeContext> context;
    Bytes enc;
  };
  absl::StatusOr<PendingOpen> StartOpen(
      const std::function<std::string(api::v1::SessionHello&, ByteSpan enc)>& edit = {});
  absl::Status FinishOpen(PendingOpen& pending, const boundary::v1::EnclaveToHost& reply);
  // Signs `hello`'s transcript (its nonce and tenant as they now are, with `enc`) with this
  // tenant's identity key, which it also sets.
  absl::Status SignHello(api::v1::SessionHello& hello, ByteSpan enc) const;

  // Seals `body` (or raw `plaintext`) as the next message of kind `kind` for `handle`.
  boundary::v1::ForwardedRequest Seal(crypto::MessageKind kind, const std::string& handle,
                                const google::protobuf::Message& body);
  boundary::v1::ForwardedRequest SealBytes(crypto::MessageKind kind, const std::string& handle,
                                     ByteSpan plaintext);

  // Opens a sealed reply: the envelope, or why the reply itself is not one this session
  // sealed (an unsealed refusal, or a reply that does not authenticate).
  absl::StatusOr<api::v1::ReplyEnvelope> OpenReplyEnvelope(
      crypto::MessageKind kind, const boundary::v1::ForwardedRequest& request,
      const boundary::v1::EnclaveReply& reply);
  // Opens a sealed reply; returns the envelope's status, and the body through `body`.
  absl::Status OpenReply(crypto::MessageKind kind, const boundary::v1::ForwardedRequest& request,
                         const boundary::v1::EnclaveReply& reply, std::string* body = nullptr);

  // Opens one frame of a generation stream for `request` (chunk number and final flag as the
  // frame claims them; the seal checks both); the chunk, or why it does not open.
  absl::StatusOr<api::v1::GenerateChunk> OpenChunk(const boundary::v1::ForwardedRequest& request,
                                                   const boundary::v1::GenerateResult& result);

  // The handle of this identity's model `name`.
  std::string Handle(const std::string& name) const;

  // A LoadModelCall for `model_bytes` under `name`; `damage` may alter the ciphertext.
  boundary::v1::HostToEnclave LoadCall(const std::string& name, const std::string& model_bytes,
                                       const std::function<void(Bytes&)>& damage = {});

  const std::string& tenant() const { return tenant_; }
  const attest::Verdict& verdict() const { return verdict_; }

 private:
  enclave::Enclave* enclave_;
  std::string tenant_;
  crypto::Ed25519KeyPair identity_;
  attest::Verdict verdict_;
  absl::Status attestation_;
  Bytes session_id_;
  std::unique_ptr<crypto::ChannelSender> sender_;
  std::unique_ptr<crypto::ChannelReceiver> receiver_;
};

// The frames an enclave streams (Generate's chunks and its replies), kept as the host's reader
// would get them, with the time each was written. Thread-safe.
class CapturedFrames : public enclave::FrameSink {
 public:
  void Write(const boundary::v1::EnclaveToHost& frame) override;

  // Every frame so far, in order.
  std::vector<boundary::v1::EnclaveToHost> Frames();
  // When each frame of `call_id` was written.
  std::vector<absl::Time> Times(uint64_t call_id);
  // The frames of `call_id` once its last one came (final, or an unsealed error);
  // DeadlineExceeded, saying how many came, when it has not come after `timeout`.
  absl::StatusOr<std::vector<boundary::v1::EnclaveToHost>> WaitForEnd(
      uint64_t call_id, absl::Duration timeout = absl::Seconds(120));
  // Waits for the first frame of `call_id`; DeadlineExceeded when none came in `timeout`.
  absl::Status WaitForAny(uint64_t call_id, absl::Duration timeout = absl::Seconds(60));

 private:
  std::vector<boundary::v1::EnclaveToHost> OfLocked(uint64_t call_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<boundary::v1::EnclaveToHost> frames_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cloister::testing
