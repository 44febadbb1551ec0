#include "sdk/client.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attest/binding.h"
#include "attest/nvidia/bundle_verifier.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/channel.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/hpke.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "sdk/npy.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;
namespace attest_pb = ::cloister::attest::v1;

struct Client::Session {
  Bytes id;
  absl::Time expires_at = absl::InfiniteFuture();
  uint64_t max_messages = 0;  // 0: no limit announced
  absl::Mutex mu;
  std::unique_ptr<crypto::ChannelSender> sender ABSL_GUARDED_BY(mu);
  std::unique_ptr<crypto::ChannelReceiver> receiver ABSL_GUARDED_BY(mu);
};

namespace {

// Replace a session this long before it expires, so that a call never races the expiry.
constexpr absl::Duration kExpiryMargin = absl::Seconds(60);
// ...or when this few messages are left of its limit.
constexpr uint64_t kMessageMargin = 16;
constexpr int kMaxMessageSize = 1 << 30;

const Clock& ClockOf(const ClientOptions& options) {
  return options.clock != nullptr ? *options.clock : *Clock::Real();
}

// gRPC metadata values must be printable ASCII without spaces for these two fields.
bool IsMetadataSafe(absl::string_view value) {
  if (value.empty()) return false;
  for (char c : value) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

absl::Status CheckConnectionOptions(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("no server address given");
  if (options.tenant_id.empty()) return absl::InvalidArgumentError("no tenant id given");
  if (!IsMetadataSafe(options.tenant_id)) {
    return absl::InvalidArgumentError(
        "the tenant id must be printable ASCII without spaces or control characters");
  }
  if (options.token.empty()) return absl::InvalidArgumentError("no API token given");
  if (!IsMetadataSafe(options.token)) {
    return absl::InvalidArgumentError(
        "the API token must be printable ASCII without spaces or control characters");
  }
  return absl::OkStatus();
}

absl::StatusOr<attest_pb::Policy> ResolvePolicy(const ClientOptions& options) {
  if (options.policy.has_value()) return *options.policy;
  if (options.policy_path.empty()) {
    return absl::InvalidArgumentError("no attestation policy given (--policy or CLOISTER_POLICY)");
  }
  return attest::LoadPolicyFile(options.policy_path);
}

// A PEM file named by a TLS option, with the option in the error.
absl::StatusOr<std::string> ReadPemOption(const std::string& path, absl::string_view option,
                                          absl::string_view kind) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(option, ": ", text.status().message()));
  }
  if (text->find(absl::StrCat("-----BEGIN ", kind)) == std::string::npos &&
      !(kind == "PRIVATE KEY" && text->find(" PRIVATE KEY-----") != std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, ": ", path, " holds no PEM ", kind));
  }
  return text;
}

// TLS credentials from the options, or plaintext ones when no CA is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const ClientOptions& options) {
  bool has_cert = !options.tls_client_cert_file.empty();
  if (options.tls_ca_file.empty()) {
    if (has_cert || !options.tls_client_key_file.empty() || !options.tls_server_name.empty()) {
      return absl::InvalidArgumentError(
          "client certificates and a TLS server name need a CA file (--ca or CLOISTER_CA)");
    }
    // Plaintext: see the header. The session itself is end-to-end encrypted.
    return grpc::InsecureChannelCredentials();
  }
  if (has_cert != !options.tls_client_key_file.empty()) {
    return absl::InvalidArgumentError("a client certificate and its key go together");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs,
                   ReadPemOption(options.tls_ca_file, "TLS CA file", "CERTIFICATE"));
  if (has_cert) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemOption(options.tls_client_cert_file,
                                                       "TLS client certificate", "CERTIFICATE"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemOption(options.tls_client_key_file,
                                                        "TLS client key", "PRIVATE KEY"));
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<api::Cloister::Stub>> MakeStub(const ClientOptions& options) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageSize);
  arguments.SetMaxSendMessageSize(kMaxMessageSize);
  if (!options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   ChannelCredentialsFor(options));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.server, credentials, arguments);
  return api::Cloister::NewStub(channel);
}

void PrepareContext(grpc::ClientContext& context, const ClientOptions& options,
                    bool with_deadline, absl::Duration timeout = absl::ZeroDuration()) {
  context.AddMetadata("x-cloister-tenant", options.tenant_id);
  context.AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
  if (with_deadline) {
    absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options.call_timeout;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(limit));
  }
}

// Converts a gRPC failure into an absl::Status with the same code and a message that names
// the call and the server.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view rpc,
                      const ClientOptions& options,
                      absl::Duration timeout = absl::ZeroDuration()) {
  auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("cannot reach cloisterd at ", options.server, ": ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat(rpc, " to ", options.server, " did not finish within ",
                       absl::FormatDuration(timeout > absl::ZeroDuration() ? timeout
                                                                           : options.call_timeout),
                       ": ", status.error_message()));
    default:
      return absl::Status(code, absl::StrCat(rpc, ": ", status.error_message()));
  }
}

std::string NewRequestId() { return HexEncode(crypto::RandomBytes(8)); }

ByteSpan SpanOf(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string StringOf(ByteSpan b) { return std::string(b.begin(), b.end()); }

// Wipes a std::string that held plaintext or a key.
void WipeString(std::string& s) {
  SecureWipe(s.data(), s.size());
  s.clear();
}

struct Attestation {
  attest_pb::ChallengeResponse challenge;
  Bytes nonce;
  attest::Verdict verdict;  // carries the evidence digest and enclave keys when it passed
};

// GetEvidence with a fresh nonce, then VerifyChallenge. An error status means no verdict.
absl::StatusOr<Attestation> FetchAndVerify(api::Cloister::Stub& stub, const ClientOptions& options,
                                           const attest_pb::Policy& policy) {
  Attestation result;
  result.nonce = crypto::RandomBytes(attest::kNonceSize);
  api::GetEvidenceRequest request;
  request.set_nonce(StringOf(result.nonce));
  // A policy that refuses cached evidence makes every attestation ask for fresh evidence.
  request.set_fresh(options.fresh_evidence || policy.require_fresh_evidence());
  api::GetEvidenceResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options, /*with_deadline=*/true);
  grpc::Status status = stub.GetEvidence(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, "GetEvidence", options);

  if (!result.challenge.ParseFromString(response.challenge_response())) {
    return absl::FailedPreconditionError(
        "attestation failed: the evidence from cloisterd is not a ChallengeResponse");
  }
  attest::EnableNvidiaGpuVerification();
  auto verdict =
      attest::VerifyChallenge(result.challenge, result.nonce, policy, ClockOf(options).Now());
  if (!verdict.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("attestation failed: ", verdict.status().message()));
  }
  result.verdict = *std::move(verdict);
  return result;
}

}  // namespace

absl::StatusOr<attest::Verdict> Attest(const ClientOptions& options) {
  RETURN_IF_ERROR(CheckConnectionOptions(options));
  ASSIGN_OR_RETURN(attest_pb::Policy policy, ResolvePolicy(options));
  ASSIGN_OR_RETURN(std::unique_ptr<api::Cloister::Stub> stub, MakeStub(options));
  ASSIGN_OR_RETURN(Attestation attestation, FetchAndVerify(*stub, options, policy));
  return std::move(attestation.verdict);
}

Client::Client(ClientOptions options, std::shared_ptr<const TenantIdentity> identity,
               attest_pb::Policy policy, std::unique_ptr<api::Cloister::Stub> stub)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      policy_(std::move(policy)),
      stub_(std::move(stub)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options,
                                                        attest::Verdict* verdict_out) {
  RETURN_IF_ERROR(CheckConnectionOptions(options));
  std::shared_ptr<const TenantIdentity> identity = options.identity;
  if (identity == nullptr) {
    if (options.identity_key_path.empty()) {
      return absl::InvalidArgumentError("no identity key given (--key or CLOISTER_KEY)");
    }
    ASSIGN_OR_RETURN(TenantIdentity loaded, TenantIdentity::Load(options.identity_key_path));
    identity = std::make_shared<const TenantIdentity>(std::move(loaded));
  }
  ASSIGN_OR_RETURN(attest_pb::Policy policy, ResolvePolicy(options));
  ASSIGN_OR_RETURN(std::unique_ptr<api::Cloister::Stub> stub, MakeStub(options));
  std::unique_ptr<Client> client(
      new Client(options, std::move(identity), std::move(policy), std::move(stub)));
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, client->OpenSession(verdict_out));
  {
    absl::MutexLock lock(&client->mu_);
    client->session_ = std::move(session);
  }
  return client;
}

absl::StatusOr<std::shared_ptr<Client::Session>> Client::OpenSession(attest::Verdict* verdict_out) {
  ASSIGN_OR_RETURN(Attestation attestation, FetchAndVerify(*stub_, options_, policy_));
  if (verdict_out != nullptr) *verdict_out = attestation.verdict;
  {
    absl::MutexLock lock(&mu_);
    verdict_ = attestation.verdict;
    evidence_ = attestation.challenge.bundle();
  }
  if (!attestation.verdict.pass) {
    return absl::FailedPreconditionError(
        absl::StrCat("attestation failed: ", attestation.verdict.FailedSummary()));
  }
  if ((options_.fresh_evidence || policy_.require_fresh_evidence()) &&
      !attestation.challenge.fresh()) {
    return absl::FailedPreconditionError(
        "attestation failed: fresh evidence was requested but the enclave sent cached evidence");
  }

  // docs/PROTOCOL.md section 3.
  const attest::Verdict& verdict = attestation.verdict;
  const Bytes& digest = verdict.evidence_digest;
  const Bytes& hpke_public_key = verdict.enclave_hpke_public_key;
  const Bytes& signing_public_key = verdict.enclave_signing_public_key;
  ASSIGN_OR_RETURN(crypto::HpkeSenderSetup setup,
                   crypto::HpkeSetupSender(crypto::kSessionSuite, hpke_public_key,
                                           crypto::SessionHpkeInfo(digest)));
  Bytes transcript = crypto::SessionTranscript(digest, hpke_public_key, signing_public_key,
                                               identity_->public_key(), setup.enc,
                                               attestation.nonce, options_.tenant_id);
  ASSIGN_OR_RETURN(Bytes signature, identity_->Sign(transcript));
  api::SessionHello hello;
  hello.set_tenant_id(options_.tenant_id);
  hello.set_identity_public_key(StringOf(identity_->public_key()));
  hello.set_client_nonce(StringOf(attestation.nonce));
  hello.set_transcript_signature(StringOf(signature));
  ASSIGN_OR_RETURN(Bytes sealed_hello, setup.context->Seal(SpanOf(options_.tenant_id),
                                                           SpanOf(hello.SerializeAsString())));

  api::OpenSessionRequest request;
  request.set_hpke_enc(StringOf(setup.enc));
  request.set_sealed_hello(StringOf(sealed_hello));
  request.set_evidence_digest(StringOf(digest));
  api::OpenSessionResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/true);
  grpc::Status status = stub_->OpenSession(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, "OpenSession", options_);

  ASSIGN_OR_RETURN(crypto::ChannelKeys keys, crypto::DeriveChannelKeys(*setup.context));
  if (response.session_id() != StringOf(keys.session_id)) {
    return absl::FailedPreconditionError(
        "OpenSession: the answer names a session id other than the one derived from our keys");
  }
  auto session = std::make_shared<Session>();
  session->id = keys.session_id;
  auto receiver = std::make_unique<crypto::ChannelReceiver>(
      keys.session_id, crypto::Direction::kEnclaveToClient, keys.enclave_to_client_key.span(),
      keys.enclave_to_client_nonce.span());
  crypto::MessageHeader welcome_header{crypto::MessageKind::kWelcome, "", ""};
  auto welcome_bytes =
      receiver->Open(response.sequence(), welcome_header, SpanOf(response.sealed_welcome()));
  if (!welcome_bytes.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "OpenSession: cannot open the enclave's welcome: ", welcome_bytes.status().message()));
  }
  api::Welcome welcome;
  if (!welcome.ParseFromArray(welcome_bytes->data(), static_cast<int>(welcome_bytes->size())) ||
      welcome.session_id() != StringOf(keys.session_id)) {
    return absl::FailedPreconditionError("OpenSession: the enclave's welcome is malformed");
  }
  if (welcome.expires_at_unix() > 0) {
    session->expires_at = absl::FromUnixSeconds(welcome.expires_at_unix());
  }
  session->max_messages = welcome.max_messages();
  {
    absl::MutexLock lock(&session->mu);
    session->receiver = std::move(receiver);
    session->sender = std::make_unique<crypto::ChannelSender>(
        keys.session_id, crypto::Direction::kClientToEnclave, keys.client_to_enclave_key.span(),
        keys.client_to_enclave_nonce.span());
  }
  return session;
}

absl::StatusOr<std::shared_ptr<Client::Session>> Client::CurrentSession() {
  auto usable = [this](Session& session) {
    if (ClockOf(options_).Now() + kExpiryMargin >= session.expires_at) return false;
    if (session.max_messages == 0) return true;
    absl::MutexLock lock(&session.mu);
    return session.sender->next_sequence() + kMessageMargin < session.max_messages;
  };
  std::shared_ptr<Session> current;
  {
    absl::MutexLock lock(&mu_);
    current = session_;
  }
  if (current != nullptr && usable(*current)) return current;
  absl::MutexLock reopen_lock(&reopen_mu_);
  {
    absl::MutexLock lock(&mu_);
    current = session_;
  }
  if (current != nullptr && usable(*current)) return current;  // another thread replaced it
  ASSIGN_OR_RETURN(std::shared_ptr<Session> fresh, OpenSession(nullptr));
  absl::MutexLock lock(&mu_);
  session_ = fresh;
  return fresh;
}

attest::Verdict Client::verdict() const {
  absl::MutexLock lock(&mu_);
  return verdict_;
}

std::string Client::evidence() const {
  absl::MutexLock lock(&mu_);
  return evidence_;
}

Bytes Client::session_id() const {
  absl::MutexLock lock(&mu_);
  return session_ != nullptr ? session_->id : Bytes{};
}

namespace {

// Opens a sealed reply to `header` and unpacks its ReplyEnvelope into `reply`.
absl::Status OpenReply(crypto::ChannelReceiver& receiver, const crypto::MessageHeader& header,
                       const api::SealedReply& sealed, google::protobuf::Message& reply) {
  auto plaintext = receiver.Open(sealed.sequence(), header, SpanOf(sealed.ciphertext()));
  if (!plaintext.ok()) {
    return absl::DataLossError(absl::StrCat("cannot open the enclave's reply to request ",
                                            header.request_id, ": ", plaintext.status().message()));
  }
  api::ReplyEnvelope envelope;
  bool parsed = envelope.ParseFromArray(plaintext->data(), static_cast<int>(plaintext->size()));
  SecureWipe(plaintext->data(), plaintext->size());
  if (!parsed) return absl::DataLossError("the enclave's reply is not a ReplyEnvelope");
  if (envelope.code() != 0) {
    int code = envelope.code();
    auto status_code =
        (code > 0 && code <= 16) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
    std::string message = envelope.message().empty()
                              ? absl::StrCat("the enclave refused the request (code ", code, ")")
                              : envelope.message();
    return absl::Status(status_code, message);
  }
  bool body_parsed = reply.ParseFromString(envelope.body());
  WipeString(*envelope.mutable_body());
  if (!body_parsed) {
    return absl::DataLossError(
        absl::StrCat("the enclave's reply body is not a ", reply.GetDescriptor()->name()));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Whether a failed idempotent call may be tried again through a new session: cloisterd or the
// enclave worker is unavailable (the worker died and is restarting), or the session's keys died
// with its worker, or the evidence changed between attesting and opening (a restart between).
bool IsRetryable(const absl::Status& status) {
  if (absl::IsUnavailable(status)) return true;
  return absl::IsFailedPrecondition(status) &&
         (absl::StrContains(status.message(), "re-attest") ||
          absl::StrContains(status.message(), "attest again"));
}

}  // namespace

void Client::DropSession(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  if (session_ == session) session_.reset();
}

absl::Status Client::SealedUnaryCall(crypto::MessageKind kind, const std::string& model_handle,
                                     const google::protobuf::Message& request,
                                     google::protobuf::Message& reply,
                                     absl::Duration timeout) {
  const bool idempotent =
      kind == crypto::MessageKind::kInfer || kind == crypto::MessageKind::kListModels;
  const int attempts = idempotent ? std::max(1, options_.max_attempts) : 1;
  absl::Duration pause = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    std::shared_ptr<Session> used;
    absl::Status status = SealedUnaryCallOnce(kind, model_handle, request, reply, timeout, used);
    if (status.ok() || attempt >= attempts || !IsRetryable(status)) return status;
    if (used != nullptr) DropSession(used);
    reply.Clear();
    absl::SleepFor(pause);
    pause *= 2;
  }
}

absl::Status Client::SealedUnaryCallOnce(crypto::MessageKind kind, const std::string& model_handle,
                                         const google::protobuf::Message& request,
                                         google::protobuf::Message& reply, absl::Duration timeout,
                                         std::shared_ptr<Session>& used) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  used = session;
  crypto::MessageHeader header{kind, NewRequestId(), model_handle};
  std::string plaintext = request.SerializeAsString();
  api::SealedCall call;
  {
    absl::MutexLock lock(&session->mu);
    auto sealed = session->sender->Seal(header, SpanOf(plaintext));
    WipeString(plaintext);
    if (!sealed.ok()) return sealed.status();
    call.set_sequence(sealed->first);
    call.set_ciphertext(StringOf(sealed->second));
  }
  call.set_session_id(StringOf(session->id));
  call.set_request_id(header.request_id);
  call.set_model_handle(model_handle);
  if (kind == crypto::MessageKind::kInfer) {
    absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options_.call_timeout;
    call.set_deadline_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(limit)));
  }

  api::SealedReply sealed_reply;
  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/true, timeout);
  grpc::Status status;
  absl::string_view rpc;
  switch (kind) {
    case crypto::MessageKind::kInfer:
      rpc = "Infer";
      status = stub_->Infer(&context, call, &sealed_reply);
      break;
    case crypto::MessageKind::kListModels:
      rpc = "ListModels";
      status = stub_->ListModels(&context, call, &sealed_reply);
      break;
    case crypto::MessageKind::kDeleteModel:
      rpc = "DeleteModel";
      status = stub_->DeleteModel(&context, call, &sealed_reply);
      break;
    default:
      CLOISTER_CHECK(false && "not a unary sealed call");
  }
  if (!status.ok()) return FromGrpc(status, rpc, options_, timeout);
  absl::MutexLock lock(&session->mu);
  return OpenReply(*session->receiver, header, sealed_reply, reply);
}

absl::StatusOr<api::ModelInfo> Client::UploadModel(const std::string& path, const std::string& name,
                                                   const UploadProgress& progress) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string message = absl::StrCat("cannot open model file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("model file ", path, " is not a regular file"));
  }
  const uint64_t plaintext_size = static_cast<uint64_t>(st.st_size);
  const uint64_t ciphertext_size = crypto::ChunkedCiphertextSize(plaintext_size);

  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  const std::string handle = crypto::ModelHandle(identity_->public_key(), name);
  SecretBytes model_key = crypto::RandomSecret(crypto::kChunkedKeySize);
  ASSIGN_OR_RETURN(
      std::unique_ptr<crypto::ChunkedEncryptor> encryptor,
      crypto::ChunkedEncryptor::Create(model_key.span(), crypto::ModelEncryptionContext(handle)));

  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/false);
  api::UploadModelResponse response;
  std::unique_ptr<grpc::ClientWriter<api::UploadModelRequest>> writer =
      stub_->UploadModel(&context, &response);

  // Sends fail once the server has closed the stream; Finish() then says why.
  bool stream_open = true;
  auto finish_with = [&](absl::Status local) -> absl::Status {
    if (stream_open) context.TryCancel();
    writer->Finish();
    return local;
  };
  {
    api::UploadModelRequest start;
    start.mutable_start()->set_session_id(StringOf(session->id));
    start.mutable_start()->set_model_handle(handle);
    start.mutable_start()->set_ciphertext_size(ciphertext_size);
    stream_open = writer->Write(start);
  }

  uint64_t sent_size = 0;
  Bytes pending;  // ciphertext not yet sent
  auto send_pending = [&](bool all) {
    size_t offset = 0;
    while (stream_open &&
           (pending.size() - offset >= kUploadMessageSize || (all && offset < pending.size()))) {
      size_t piece = std::min(kUploadMessageSize, pending.size() - offset);
      api::UploadModelRequest message;
      message.set_data(pending.data() + offset, piece);
      stream_open = writer->Write(message);
      offset += piece;
      sent_size += piece;
      if (stream_open && progress) progress(sent_size, ciphertext_size);
    }
    pending.erase(pending.begin(), pending.begin() + offset);
  };

  crypto::Hasher hasher(crypto::HashAlg::kSha256);
  std::vector<uint8_t> buffer(kUploadMessageSize);
  uint64_t read_size = 0;
  while (stream_open) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return finish_with(absl::PermissionDeniedError(
          absl::StrCat("cannot read model file ", path, ": ", std::strerror(errno))));
    }
    if (n == 0) break;
    ByteSpan piece(buffer.data(), static_cast<size_t>(n));
    read_size += piece.size();
    if (read_size > plaintext_size) break;
    hasher.Update(piece);
    absl::Status updated = encryptor->Update(piece, pending);
    if (!updated.ok()) return finish_with(updated);
    send_pending(/*all=*/false);
  }
  SecureWipe(buffer.data(), buffer.size());
  if (stream_open && read_size != plaintext_size) {
    return finish_with(absl::AbortedError(
        absl::StrCat("model file ", path, " changed size while it was being uploaded")));
  }
  if (stream_open) {
    absl::Status finished = encryptor->Finish(pending);
    if (!finished.ok()) return finish_with(finished);
    send_pending(/*all=*/true);
  }

  crypto::MessageHeader header{crypto::MessageKind::kLoadModel, NewRequestId(), handle};
  if (stream_open) {
    CLOISTER_CHECK(sent_size == ciphertext_size);
    api::LoadModelRequest load;
    load.set_name(name);
    load.set_model_key(StringOf(model_key.span()));
    load.set_plaintext_sha256(StringOf(hasher.Finish()));
    load.set_plaintext_size(plaintext_size);
    std::string plaintext = load.SerializeAsString();
    WipeString(*load.mutable_model_key());
    api::UploadModelRequest finish;
    api::SealedCall& call = *finish.mutable_finish();
    {
      absl::MutexLock lock(&session->mu);
      auto sealed = session->sender->Seal(header, SpanOf(plaintext));
      WipeString(plaintext);
      if (!sealed.ok()) return finish_with(sealed.status());
      call.set_sequence(sealed->first);
      call.set_ciphertext(StringOf(sealed->second));
    }
    call.set_session_id(StringOf(session->id));
    call.set_request_id(header.request_id);
    call.set_model_handle(handle);
    stream_open = writer->Write(finish) && writer->WritesDone();
  }
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpc(status, "UploadModel", options_);
  if (!stream_open) {
    return absl::UnavailableError("UploadModel: cloisterd closed the upload stream early");
  }
  api::LoadModelReply reply;
  {
    absl::MutexLock lock(&session->mu);
    RETURN_IF_ERROR(OpenReply(*session->receiver, header, response.reply(), reply));
  }
  return std::move(*reply.mutable_model());
}

absl::StatusOr<std::vector<api::ModelInfo>> Client::ListModels() {
  api::ListModelsRequest request;
  api::ListModelsReply reply;
  RETURN_IF_ERROR(SealedUnaryCall(crypto::MessageKind::kListModels, "", request, reply));
  return std::vector<api::ModelInfo>(reply.models().begin(), reply.models().end());
}

absl::Status Client::DeleteModel(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  api::DeleteModelRequest request;
  request.set_name(name);
  api::DeleteModelReply reply;
  return SealedUnaryCall(crypto::MessageKind::kDeleteModel,
                         crypto::ModelHandle(identity_->public_key(), name), request, reply);
}

absl::StatusOr<std::vector<api::Tensor>> Client::Infer(const std::string& name,
                                                       std::vector<api::Tensor> inputs,
                                                       const std::vector<std::string>& outputs,
                                                       absl::Duration timeout) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (inputs.empty()) return absl::InvalidArgumentError("no input tensors given");
  api::InferRequestPayload payload;
  for (api::Tensor& input : inputs) {
    // Check sizes here so a malformed tensor gets a clear local error.
    RETURN_IF_ERROR(ValidateTensor(input));
    *payload.add_inputs() = std::move(input);
  }
  for (const std::string& output : outputs) payload.add_outputs(output);
  api::InferReplyPayload reply;
  absl::Status status =
      SealedUnaryCall(crypto::MessageKind::kInfer,
                      crypto::ModelHandle(identity_->public_key(), name), payload, reply,
                      timeout);
  for (api::Tensor& input : *payload.mutable_inputs()) WipeString(*input.mutable_raw());
  RETURN_IF_ERROR(status);
  return std::vector<api::Tensor>(std::make_move_iterator(reply.mutable_outputs()->begin()),
                                  std::make_move_iterator(reply.mutable_outputs()->end()));
}

}  // namespace cloister::sdk
