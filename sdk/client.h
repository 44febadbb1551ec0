// The tenant client: attests the enclave behind a `cloisterd`, opens an end-to-end encrypted
// session to it (docs/PROTOCOL.md sections 2 and 3), and uploads models, lists and deletes
// them, runs inference and streams text generations through that session (sections 4 and 5,
// and "Generation streams"). The host relays only
// ciphertext; every reply is a sealed ReplyEnvelope, so errors come from the enclave itself
// and a non-OK code in it becomes an absl::Status with that code and message.
//
// Connection: gRPC over TLS when ClientOptions::tls_ca_file is set (the server's certificate
// must chain to that CA and name the host in `server`), with a client certificate for mutual
// TLS when tls_client_cert_file is set. Otherwise plaintext: meant for loopback and development
// (the session is encrypted end to end regardless, but the API token travels in the clear).
//
// Several endpoints: ClientOptions::server may list several cloisterd nodes, comma-separated
// ("a.example:7700,b.example:7700"). Connect tries them in the order given (or, with
// spread_endpoints, from a start that the identity key picks) and opens the session on the
// first one whose attestation passes;
// every call of that session goes to that node, and a session replaced because it expires is
// replaced on that node too. When the node becomes unavailable (a new session cannot be opened
// there because it refuses connections or does not answer in time, or an idempotent call is
// still UNAVAILABLE after max_attempts on it) the client moves to the next endpoint in the
// list (wrapping around), attests it against the same policy, opens a new session there and
// carries on; the call that found the node down is retried there when it is idempotent
// (uploads and deletes fail, the next call moves). Models are per node: an uploaded model
// lives in the store of the node it was uploaded to, so a model must be uploaded to every
// node a client may move to; a call for a model that the new node lacks fails with NotFound
// naming that node.
//
// Threading: a Client is thread-safe. Several threads may call Infer (and the other methods)
// at once; sealing and opening take a short lock, the RPCs themselves run unlocked, and
// replies may arrive in any order. A session that is about to expire (time or message
// limit) is replaced by a new one, after attesting again, before the next call; so is one
// whose enclave worker died (see ClientOptions::max_attempts for the retries).
// Ownership: the Client owns its gRPC channels (one per endpoint), identity key and session
// keys.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "crypto/channel.h"
#include "sdk/generate_stream.h"
#include "sdk/identity.h"

namespace cloister::sdk {

inline constexpr char kDefaultServer[] = "127.0.0.1:7700";
// Ciphertext bytes per UploadModel data message.
inline constexpr size_t kUploadMessageSize = size_t{1} << 20;

struct ClientOptions {
  // cloisterd to connect to: HOST:PORT (IPv6 as [ADDR]:PORT), or a gRPC target with a scheme
  // (unix:/path, dns:///host:port); several comma-separated for failover (see above).
  std::string server = kDefaultServer;
  // With several endpoints: start from the one chosen by the identity key (its SHA-256,
  // modulo the number of endpoints) instead of the first, then go on in list order, wrapping.
  // One list given to every tenant then spreads them over the nodes, and a tenant comes back
  // to the same node (where its uploads are) each time it connects.
  bool spread_endpoints = false;
  std::string tenant_id;
  std::string token;  // the tenant's API token (not a file name)

  // TLS: PEM CA bundle that the server's certificate must chain to; empty: plaintext.
  std::string tls_ca_file;
  // Mutual TLS: the client's PEM certificate chain and key (both or neither; need tls_ca_file).
  std::string tls_client_cert_file;
  std::string tls_client_key_file;
  // The name to expect in the server's certificate when it differs from the host in `server`
  // (e.g. connecting by IP address to a certificate issued for a DNS name); empty: that host.
  // With several endpoints it applies to each of them.
  std::string tls_server_name;

  // The attestation policy: `policy` when set, otherwise the file at `policy_path`.
  std::optional<cloister::attest::v1::Policy> policy;
  std::string policy_path;

  // The identity key: `identity` when set, otherwise the file at `identity_key_path`.
  // Attest() needs neither.
  std::shared_ptr<const TenantIdentity> identity;
  std::string identity_key_path;

  // Ask for hardware evidence collected over our own nonce (slow) instead of the enclave's
  // cached evidence countersigned over our nonce (fast). Implied when the policy sets
  // require_fresh_evidence.
  bool fresh_evidence = false;
  // Deadline for each unary RPC (and the scheduling deadline sent with Infer).
  absl::Duration call_timeout = absl::Seconds(60);
  // Infer and ListModels (idempotent) are tried up to this many times in all when cloisterd
  // answers UNAVAILABLE (e.g. the enclave worker holding the session died and is restarting)
  // or refuses the session because its worker restarted ("re-attest"). Each retry first waits
  // (retry_backoff, doubling each time), then attests again and opens a new session. 1: no
  // retries. Uploads and deletes are never retried.
  int max_attempts = 3;
  absl::Duration retry_backoff = absl::Milliseconds(200);
  // The time attestation is checked at; nullptr means the real clock. Not owned.
  const Clock* clock = nullptr;
};

// Called after each upload message with the ciphertext bytes sent so far and in total.
using UploadProgress = std::function<void(uint64_t sent_size, uint64_t total_size)>;

// Called with each chunk of a generation as it arrives, after the chunk passed every check
// (GenerateStreamVerifier); on the thread that called Generate.
using GenerateChunkCallback = std::function<void(const cloister::api::v1::GenerateChunk& chunk)>;
// Asked before the stream starts and after each chunk (from the thread that called Generate):
// true stops the generation there. The RPC is cancelled, so cloisterd cancels the sequence in
// the enclave, and Generate returns CANCELLED.
using GenerateCancelled = std::function<bool()>;

// Splits ClientOptions::server into its endpoints. InvalidArgument naming the bad entry for
// an empty list or entry, whitespace, a missing or out-of-range port, or a repeated endpoint.
absl::StatusOr<std::vector<std::string>> ParseServerList(absl::string_view server);

// The endpoint index that ClientOptions::spread_endpoints starts from for this identity:
// the first 8 bytes of the SHA-256 of its public key, big-endian, modulo `endpoints` (0 for
// one endpoint or none).
size_t SpreadStart(const Bytes& identity_public_key, size_t endpoints);

// Only attests: fetches evidence with a fresh random nonce and verifies it against the
// policy. With several endpoints, attests the first one that can be reached. Returns the
// verdict whether it passes or fails; an error status means no verdict could be reached:
// InvalidArgument/NotFound for a bad policy file or server list, the gRPC error when
// cloisterd cannot be reached or refuses the call, FailedPrecondition("attestation failed:
// ...") when the evidence cannot even be parsed.
absl::StatusOr<attest::Verdict> Attest(const ClientOptions& options);

class Client {
 public:
  // Attests and opens a session on the first endpoint whose attestation passes (in the order
  // of ClientOptions::server). With one endpoint, FailedPrecondition("attestation failed:
  // <failed checks>") when the verdict is fail; `verdict_out`, when given, receives the verdict
  // whenever verification ran (pass or fail). Other errors: the identity key or policy cannot
  // be loaded, cloisterd is unreachable or refuses (its gRPC status), or the enclave refuses
  // the session. With several endpoints and none usable, the error of the first endpoint that
  // answered (else UNAVAILABLE), with every endpoint's error in the message.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options,
                                                         attest::Verdict* verdict_out = nullptr);
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The verdict of the most recent attestation: the one that admitted the current session,
  // or, when replacing an expiring session failed attestation, that failing verdict.
  attest::Verdict verdict() const;
  // The serialized EvidenceBundle that the most recent attestation verified (the same moment
  // as verdict()), for keeping or for checking again offline with VerifyBundle.
  std::string evidence() const;
  const std::string& tenant_id() const { return options_.tenant_id; }
  const Bytes& identity_public_key() const { return identity_->public_key(); }
  // The current session id (16 bytes).
  Bytes session_id() const;
  // The endpoint (one entry of ClientOptions::server) that the current session is on.
  std::string current_server() const;

  // Encrypts the model file at `path` with a fresh key and uploads it under `name`; the
  // enclave decrypts, checks and loads it and answers with its description. When the worker
  // dies during the upload (cloisterd answers UNAVAILABLE: nothing was stored) the upload is
  // tried again, on a new session, up to options.max_attempts times in all. NotFound or
  // PermissionDenied when the file cannot be read, InvalidArgument for an empty name, the
  // enclave's status when it refuses the model.
  absl::StatusOr<cloister::api::v1::ModelInfo> UploadModel(const std::string& path,
                                                           const std::string& name,
                                                           const UploadProgress& progress = {});
  // The models this identity owns, then the operator-published ones (ModelInfo.published).
  absl::StatusOr<std::vector<cloister::api::v1::ModelInfo>> ListModels();
  // The handle that calls for model `name` use: the operator-published model's when the
  // attested enclave publishes `name` (Verdict::published_models), else this identity's own.
  std::string ModelHandleFor(const std::string& name) const;
  // Deletes a model this identity owns (NotFound from the enclave when there is none).
  absl::Status DeleteModel(const std::string& name);
  // Runs `name` on `inputs`; `outputs` names the outputs wanted (empty: all of them).
  // `timeout` replaces options.call_timeout for this call (both the RPC deadline and the
  // scheduling deadline) when it is above zero.
  // The inputs are serialized straight into the sealed call; the client keeps no copy of them.
  absl::StatusOr<std::vector<cloister::api::v1::Tensor>> Infer(
      const std::string& name, const std::vector<cloister::api::v1::Tensor>& inputs,
      const std::vector<std::string>& outputs = {}, absl::Duration timeout = absl::ZeroDuration());
  // Generates text with the LLM `name` (one of this identity's, or published): seals `request` for the
  // model, opens the Generate stream and checks every chunk before it is used; `on_chunk`
  // (when set) gets each one as it arrives, the final one included. Returns the assembled
  // result once the final chunk has been accepted. `timeout` above zero replaces
  // options.call_timeout for the whole stream (the RPC deadline and the request's own).
  // Errors: InvalidArgument for an empty name or a request without a prompt; the enclave's
  // status (its code, message and reason) when it ends the stream with an error chunk; DATA_LOSS
  // naming what was wrong when a chunk fails a check (a gap, chunks out of order, a replayed
  // chunk, a chunk that does not open, anything after the final chunk) or the stream ends
  // without its final chunk; the gRPC error when the stream fails before its final chunk. A
  // sampled generation is not idempotent, so a failed one is tried again (the retries of Infer,
  // ClientOptions::max_attempts) only when the request fixes the seed and no chunk of it has
  // arrived yet. `cancelled` (when set) stops the generation early (GenerateCancelled).
  absl::StatusOr<GenerateResult> Generate(const std::string& name,
                                          const cloister::api::v1::GenerateRequest& request,
                                          const GenerateChunkCallback& on_chunk = {},
                                          absl::Duration timeout = absl::ZeroDuration(),
                                          const GenerateCancelled& cancelled = {});

 private:
  struct Session;
  struct Endpoint {
    std::string address;
    std::unique_ptr<cloister::api::v1::Cloister::Stub> stub;
  };
  Client(ClientOptions options, std::shared_ptr<const TenantIdentity> identity,
         cloister::attest::v1::Policy policy, std::vector<Endpoint> endpoints);

  // Attests endpoints_[endpoint] and opens a new session there; stores the verdict even when
  // attestation fails.
  absl::StatusOr<std::shared_ptr<Session>> OpenSession(size_t endpoint,
                                                       attest::Verdict* verdict_out);
  // Opens a session on the first usable endpoint in `order`, makes it the current one and
  // returns it; when none is usable, one error that names every endpoint's failure.
  // `first_unless_unreachable`: go past the first endpoint only when it cannot be reached
  // (a node that answers but refuses is not left for another).
  absl::StatusOr<std::shared_ptr<Session>> OpenSessionOnFirstOf(
      const std::vector<size_t>& order, attest::Verdict* verdict_out,
      bool first_unless_unreachable = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reopen_mu_);
  // The current session, replaced first when it is expired or about to be. A replacement is
  // opened on the current endpoint; when that endpoint is unreachable, on the next ones.
  absl::StatusOr<std::shared_ptr<Session>> CurrentSession();
  // One attempt of UploadModel.
  absl::StatusOr<cloister::api::v1::ModelInfo> UploadModelOnce(const std::string& path,
                                                              const std::string& name,
                                                              const UploadProgress& progress);
  // Moves off `failed` (an endpoint index) to the next usable endpoint, unless another thread
  // already has. True when the current session is now on another endpoint.
  bool FailOver(size_t failed);
  // Writes a call's plaintext into the buffer it is sealed in (proto/sealing.h): the span to
  // seal, ending in room for the tag.
  using Serializer = std::function<absl::StatusOr<std::span<uint8_t>>(std::string& buffer)>;
  // One try of a call through the current session; `used` receives the session it went
  // through (if any).
  using Attempt = std::function<absl::Status(std::shared_ptr<Session>& used)>;
  // Runs `attempt` until it succeeds or fails for good. A failure that IsRetryable is tried
  // again while `may_retry()` (asked after each failure) says so: after retry_backoff (doubling)
  // through a new session, up to ClientOptions::max_attempts on a node, then on the next node.
  // A retryable failure leaves its session behind either way. `names_model`: a NotFound names
  // the node that lacks the model when there are several.
  absl::Status CallWithRetries(const Attempt& attempt, const std::function<bool()>& may_retry,
                               bool names_model);
  // Seals the request `serialize` writes, runs one unary RPC and opens the sealed ReplyEnvelope
  // into `reply`. `timeout` above zero replaces options_.call_timeout. Infer and ListModels are
  // retried as ClientOptions::max_attempts says (each attempt serializes afresh).
  absl::Status SealedUnaryCall(crypto::MessageKind kind, const std::string& model_handle,
                               const Serializer& serialize, google::protobuf::Message& reply,
                               absl::Duration timeout = absl::ZeroDuration());
  // One attempt of SealedUnaryCall; `used` receives the session it went through (if any).
  absl::Status SealedUnaryCallOnce(crypto::MessageKind kind, const std::string& model_handle,
                                   const Serializer& serialize, google::protobuf::Message& reply,
                                   absl::Duration timeout, std::shared_ptr<Session>& used);
  // One attempt of Generate for `model_handle`; `delivered` is set once a chunk has been
  // accepted (from then on the attempt is not repeated).
  absl::StatusOr<GenerateResult> GenerateOnce(const std::string& model_handle,
                                              const cloister::api::v1::GenerateRequest& request,
                                              const GenerateChunkCallback& on_chunk,
                                              absl::Duration timeout,
                                              const GenerateCancelled& cancelled,
                                              std::shared_ptr<Session>& used, bool& delivered);
  // Forgets `session` if it is still the current one, so the next call attests again.
  void DropSession(const std::shared_ptr<Session>& session);

  const ClientOptions options_;
  const std::shared_ptr<const TenantIdentity> identity_;
  const cloister::attest::v1::Policy policy_;
  const std::vector<Endpoint> endpoints_;  // one per entry of options_.server, in order

  mutable absl::Mutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  size_t current_endpoint_ ABSL_GUARDED_BY(mu_) = 0;  // where the next session is opened
  attest::Verdict verdict_ ABSL_GUARDED_BY(mu_);
  std::string evidence_ ABSL_GUARDED_BY(mu_);  // serialized EvidenceBundle behind verdict_
  // Serializes session replacement so concurrent callers attest once, not once each.
  absl::Mutex reopen_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace cloister::sdk
