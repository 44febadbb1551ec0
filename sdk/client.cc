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

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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
#include "proto/frame.h"
#include "proto/sealing.h"
#include "sdk/model_dir.h"
#include "sdk/npy.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;
namespace attest_pb = ::cloister::attest::v1;

struct Client::Session {
  size_t endpoint = 0;  // index into Client::endpoints_: the node that holds this session
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
  RETURN_IF_ERROR(ParseServerList(options.server).status());
  if (options.tenant_id.empty()) return absl::InvalidArgumentError("no tenant id given");
  if (!IsMetadataSafe(options.tenant_id)) {
    return absl::InvalidArgumentError(
        "the tenant id must be printable ASCII without spaces or control characters");
  }
  // Without a token the client certificate must speak for the tenant (cloisterd admits a
  // tenant bound to mtls_identities by its certificate alone).
  if (options.token.empty() && options.tls_client_cert_file.empty()) {
    return absl::InvalidArgumentError("no API token given (nor a client certificate)");
  }
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
    return absl::Status(text.status().code(), absl::StrCat(option, ": ", text.status().message()));
  }
  if (text->find(absl::StrCat("-----BEGIN ", kind)) == std::string::npos &&
      !(kind == "PRIVATE KEY" && text->find(" PRIVATE KEY-----") != std::string::npos)) {
    return absl::InvalidArgumentError(absl::StrCat(option, ": ", path, " holds no PEM ", kind));
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
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPemOption(options.tls_client_key_file, "TLS client key", "PRIVATE KEY"));
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<api::Cloister::Stub>> MakeStub(const ClientOptions& options,
                                                              const std::string& server) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageSize);
  arguments.SetMaxSendMessageSize(kMaxMessageSize);
  if (!options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   ChannelCredentialsFor(options));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(server, credentials, arguments);
  return api::Cloister::NewStub(channel);
}

void PrepareContext(grpc::ClientContext& context, const ClientOptions& options, bool with_deadline,
                    absl::Duration timeout = absl::ZeroDuration()) {
  context.AddMetadata("x-cloister-tenant", options.tenant_id);
  if (!options.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
  }
  if (with_deadline) {
    absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options.call_timeout;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(limit));
  }
}

// Converts a gRPC failure into an absl::Status with the same code and a message that names
// the call and the server (one endpoint of options.server).
absl::Status FromGrpc(const grpc::Status& status, absl::string_view rpc, absl::string_view server,
                      const ClientOptions& options, absl::Duration timeout = absl::ZeroDuration()) {
  auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("cannot reach cloisterd at ", server, ": ", status.error_message()));
    case grpc::StatusCode::CANCELLED:
      // This client never cancels a call whose status it reports, so the server side dropped
      // it: cloisterd is shutting down. That node is going away, as with UNAVAILABLE.
      return absl::UnavailableError(
          absl::StrCat("cloisterd at ", server, " dropped ", rpc,
                       " (it is shutting down?): ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat(
          rpc, " to ", server, " did not finish within ",
          absl::FormatDuration(timeout > absl::ZeroDuration() ? timeout : options.call_timeout),
          ": ", status.error_message()));
    default:
      return absl::Status(code, absl::StrCat(rpc, ": ", status.error_message()));
  }
}

std::string NewRequestId() { return HexEncode(crypto::RandomBytes(8)); }

ByteSpan SpanOf(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string StringOf(ByteSpan b) { return ToString(b); }

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
absl::StatusOr<Attestation> FetchAndVerify(api::Cloister::Stub& stub, absl::string_view server,
                                           const ClientOptions& options,
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
  if (!status.ok()) return FromGrpc(status, "GetEvidence", server, options);

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

// Whether `failure` (from attesting or opening a session on one endpoint) means the endpoint
// cannot be reached, so that the next one should be tried: it refused the connection or went
// away (UNAVAILABLE), or it did not even answer within the call timeout.
bool IsUnreachable(const absl::Status& failure) {
  return absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure);
}

// One error for a failure on every endpoint tried: the only one unchanged, otherwise the code
// of the first endpoint that answered (UNAVAILABLE when none did) and every endpoint's reason.
absl::Status CombineEndpointFailures(
    const std::vector<std::pair<std::string, absl::Status>>& failures) {
  CLOISTER_CHECK(!failures.empty());
  if (failures.size() == 1) return failures.front().second;
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  for (const auto& [address, failure] : failures) {
    if (!IsUnreachable(failure)) {
      code = failure.code();
      break;
    }
  }
  std::vector<std::string> reasons;
  for (const auto& [address, failure] : failures) {
    reasons.push_back(absl::StrContains(failure.message(), address)
                          ? std::string(failure.message())
                          : absl::StrCat(address, ": ", failure.message()));
  }
  return absl::Status(code,
                      absl::StrCat("no endpoint could be used: ", absl::StrJoin(reasons, "; ")));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseServerList(absl::string_view server) {
  if (absl::StripAsciiWhitespace(server).empty()) {
    return absl::InvalidArgumentError("no server address given");
  }
  std::vector<std::string> endpoints;
  for (absl::string_view entry : absl::StrSplit(server, ',')) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server list \"", server, "\" has an empty entry (endpoints are comma-separated)"));
    }
    for (char c : entry) {
      if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
          !absl::ascii_isprint(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "server endpoint \"", entry, "\" contains whitespace or a control character"));
      }
    }
    // A gRPC target with a scheme (unix:/path, dns:///host:port, ...) is passed on as it is.
    bool has_scheme = absl::StartsWith(entry, "unix:") ||
                      absl::StartsWith(entry, "unix-abstract:") || absl::StrContains(entry, ":///");
    if (!has_scheme) {
      size_t colon = entry.rfind(':');
      absl::string_view host = colon == absl::string_view::npos ? "" : entry.substr(0, colon);
      absl::string_view port_text = colon == absl::string_view::npos ? "" : entry.substr(colon + 1);
      int port = 0;
      if (host.empty() || port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 1 ||
          port > 65535 || port_text.find_first_not_of("0123456789") != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "server endpoint \"", entry, "\" is not HOST:PORT with a port from 1 to 65535"));
      }
      bool bracketed = host.front() == '[';
      if (bracketed != (host.back() == ']') ||
          (!bracketed && host.find(':') != absl::string_view::npos)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "server endpoint \"", entry, "\": write an IPv6 address in brackets, [ADDR]:PORT"));
      }
    }
    if (std::find(endpoints.begin(), endpoints.end(), entry) != endpoints.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("server endpoint \"", entry, "\" is listed twice"));
    }
    endpoints.emplace_back(entry);
  }
  return endpoints;
}

absl::StatusOr<attest::Verdict> Attest(const ClientOptions& options) {
  RETURN_IF_ERROR(CheckConnectionOptions(options));
  ASSIGN_OR_RETURN(std::vector<std::string> servers, ParseServerList(options.server));
  ASSIGN_OR_RETURN(attest_pb::Policy policy, ResolvePolicy(options));
  std::vector<std::pair<std::string, absl::Status>> failures;
  for (const std::string& server : servers) {
    ASSIGN_OR_RETURN(std::unique_ptr<api::Cloister::Stub> stub, MakeStub(options, server));
    absl::StatusOr<Attestation> attestation = FetchAndVerify(*stub, server, options, policy);
    if (attestation.ok()) return std::move(attestation->verdict);
    failures.emplace_back(server, attestation.status());
    if (!IsUnreachable(attestation.status())) break;  // it answered: that is the verdict
  }
  return CombineEndpointFailures(failures);
}

Client::Client(ClientOptions options, std::shared_ptr<const TenantIdentity> identity,
               attest_pb::Policy policy, std::vector<Endpoint> endpoints)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      policy_(std::move(policy)),
      endpoints_(std::move(endpoints)) {
  CLOISTER_CHECK(!endpoints_.empty());
}

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
  ASSIGN_OR_RETURN(std::vector<std::string> servers, ParseServerList(options.server));
  std::vector<Endpoint> endpoints;
  std::vector<size_t> order;
  for (std::string& server : servers) {
    ASSIGN_OR_RETURN(std::unique_ptr<api::Cloister::Stub> stub, MakeStub(options, server));
    order.push_back(endpoints.size());
    endpoints.push_back(Endpoint{std::move(server), std::move(stub)});
  }
  std::unique_ptr<Client> client(
      new Client(options, std::move(identity), std::move(policy), std::move(endpoints)));
  {
    absl::MutexLock reopen_lock(&client->reopen_mu_);
    RETURN_IF_ERROR(client->OpenSessionOnFirstOf(order, verdict_out).status());
  }
  return client;
}

absl::StatusOr<std::shared_ptr<Client::Session>> Client::OpenSessionOnFirstOf(
    const std::vector<size_t>& order, attest::Verdict* verdict_out, bool first_unless_unreachable) {
  std::vector<std::pair<std::string, absl::Status>> failures;
  for (size_t endpoint : order) {
    if (first_unless_unreachable && failures.size() == 1 && !IsUnreachable(failures[0].second)) {
      break;
    }
    absl::StatusOr<std::shared_ptr<Session>> session = OpenSession(endpoint, verdict_out);
    if (session.ok()) {
      absl::MutexLock lock(&mu_);
      session_ = *session;
      current_endpoint_ = endpoint;
      return session;
    }
    failures.emplace_back(endpoints_[endpoint].address, session.status());
  }
  return CombineEndpointFailures(failures);
}

absl::StatusOr<std::shared_ptr<Client::Session>> Client::OpenSession(size_t endpoint,
                                                                     attest::Verdict* verdict_out) {
  CLOISTER_CHECK(endpoint < endpoints_.size());
  const std::string& server = endpoints_[endpoint].address;
  api::Cloister::Stub& stub = *endpoints_[endpoint].stub;
  ASSIGN_OR_RETURN(Attestation attestation, FetchAndVerify(stub, server, options_, policy_));
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
  grpc::Status status = stub.OpenSession(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, "OpenSession", server, options_);

  ASSIGN_OR_RETURN(crypto::ChannelKeys keys, crypto::DeriveChannelKeys(*setup.context));
  if (response.session_id() != StringOf(keys.session_id)) {
    return absl::DataLossError(
        "OpenSession: the answer names a session id other than the one derived from our keys");
  }
  auto session = std::make_shared<Session>();
  session->endpoint = endpoint;
  session->id = keys.session_id;
  auto receiver = std::make_unique<crypto::ChannelReceiver>(
      keys.session_id, crypto::Direction::kEnclaveToClient, keys.enclave_to_client_key.span(),
      keys.enclave_to_client_nonce.span());
  crypto::MessageHeader welcome_header{crypto::MessageKind::kWelcome, "", ""};
  auto welcome_bytes =
      receiver->Open(response.sequence(), welcome_header, SpanOf(response.sealed_welcome()));
  if (!welcome_bytes.ok()) {
    return absl::DataLossError(absl::StrCat(
        "OpenSession: cannot open the enclave's welcome: ", welcome_bytes.status().message()));
  }
  api::Welcome welcome;
  if (!welcome.ParseFromArray(welcome_bytes->data(), static_cast<int>(welcome_bytes->size())) ||
      welcome.session_id() != StringOf(keys.session_id)) {
    return absl::DataLossError("OpenSession: the enclave's welcome is malformed");
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
  size_t home;
  {
    absl::MutexLock lock(&mu_);
    home = current_endpoint_;
  }
  // The node the session was on first; the others (in list order after it) only when that
  // node cannot be reached.
  std::vector<size_t> order;
  for (size_t step = 0; step < endpoints_.size(); ++step) {
    order.push_back((home + step) % endpoints_.size());
  }
  return OpenSessionOnFirstOf(order, nullptr, /*first_unless_unreachable=*/true);
}

bool Client::FailOver(size_t failed) {
  absl::MutexLock reopen_lock(&reopen_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (current_endpoint_ != failed) return true;  // another thread already moved
  }
  std::vector<size_t> order;
  for (size_t step = 1; step < endpoints_.size(); ++step) {
    order.push_back((failed + step) % endpoints_.size());
  }
  return !order.empty() && OpenSessionOnFirstOf(order, nullptr).ok();
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

std::string Client::current_server() const {
  absl::MutexLock lock(&mu_);
  return endpoints_[session_ != nullptr ? session_->endpoint : current_endpoint_].address;
}

namespace {

// Opens a sealed reply to `header` and unpacks its ReplyEnvelope into `reply`.
// The reply is opened in place, in its own ciphertext field.
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

// Serializes a whole request message for SealedUnaryCall.
auto SerializerOf(const google::protobuf::MessageLite& request) {
  return [&request](std::string& buffer) { return proto::SerializeForSealing(request, buffer); };
}

}  // namespace

void Client::DropSession(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  if (session_ == session) session_.reset();
}

absl::Status Client::SealedUnaryCall(crypto::MessageKind kind, const std::string& model_handle,
                                     const Serializer& serialize, google::protobuf::Message& reply,
                                     absl::Duration timeout) {
  const bool idempotent =
      kind == crypto::MessageKind::kInfer || kind == crypto::MessageKind::kListModels;
  const int attempts = idempotent ? std::max(1, options_.max_attempts) : 1;
  // Each failover gives the call a fresh budget of attempts on the next node; a call moves
  // across each other node at most once.
  size_t failovers_left = endpoints_.size() - 1;
  absl::Duration pause = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    std::shared_ptr<Session> used;
    absl::Status status = SealedUnaryCallOnce(kind, model_handle, serialize, reply, timeout, used);
    if (absl::IsNotFound(status) && used != nullptr && endpoints_.size() > 1 &&
        (kind == crypto::MessageKind::kInfer || kind == crypto::MessageKind::kDeleteModel)) {
      // Models live in one node's store; say which node lacks it.
      return absl::NotFoundError(absl::StrCat(
          status.message(), " (on ", endpoints_[used->endpoint].address,
          "; each node keeps its own models: upload the model to every endpoint the client "
          "may move to)"));
    }
    if (status.ok() || !IsRetryable(status)) return status;
    if (attempt >= attempts) {
      // This node's budget is spent: an idempotent call moves on to the next node. Any call
      // leaves the session behind, so the next call attests again (and moves on when the node
      // is down).
      if (used != nullptr) DropSession(used);
      if (!idempotent || used == nullptr || failovers_left == 0) return status;
      if (!FailOver(used->endpoint)) return status;
      --failovers_left;
      attempt = 0;
      pause = options_.retry_backoff;
      reply.Clear();
      continue;
    }
    if (used != nullptr) DropSession(used);
    reply.Clear();
    absl::SleepFor(pause);
    pause *= 2;
  }
}

absl::Status Client::SealedUnaryCallOnce(crypto::MessageKind kind, const std::string& model_handle,
                                         const Serializer& serialize,
                                         google::protobuf::Message& reply, absl::Duration timeout,
                                         std::shared_ptr<Session>& used) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  used = session;
  crypto::MessageHeader header{kind, NewRequestId(), model_handle};
  api::SealedCall call;
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
    call.set_deadline_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(limit)));
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

absl::StatusOr<api::ModelInfo> Client::UploadModel(const std::string& path, const std::string& name,
                                                   const UploadProgress& progress) {
  // An upload is retried only when cloisterd says that nothing of it was stored (its worker
  // died during it): otherwise a retry could meet its own first attempt.
  absl::Duration pause = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<api::ModelInfo> uploaded = UploadModelOnce(path, name, progress);
    if (uploaded.ok() || attempt >= std::max(1, options_.max_attempts) ||
        !absl::IsUnavailable(uploaded.status()) ||
        !absl::StrContains(uploaded.status().message(), "nothing was stored")) {
      return uploaded;
    }
    absl::SleepFor(pause);
    pause *= 2;
  }
}

absl::StatusOr<api::ModelInfo> Client::UploadModelOnce(const std::string& path,
                                                       const std::string& name,
                                                       const UploadProgress& progress) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  // What is uploaded: the ONNX file, read as it is sent, or the package of a checkpoint folder
  // (docs/PROTOCOL.md, "Model packages"), packed in memory first.
  struct stat path_st;
  const bool is_folder = ::stat(path.c_str(), &path_st) == 0 && S_ISDIR(path_st.st_mode);
  Bytes package;
  int fd = -1;
  if (is_folder) {
    ASSIGN_OR_RETURN(package, PackModelDir(path, boundary::kMaxFrameSize));
  } else {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      std::string message = absl::StrCat("cannot open model file ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
    }
  }
  // Closes the file, and wipes the package's plaintext, on every way out.
  struct SourceCloser {
    int fd;
    Bytes& package;
    ~SourceCloser() {
      if (fd >= 0) ::close(fd);
      SecureWipe(package.data(), package.size());
    }
  } closer{fd, package};
  uint64_t plaintext_size = package.size();
  if (!is_folder) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model file ", path, " is not a regular file"));
    }
    plaintext_size = static_cast<uint64_t>(st.st_size);
  }
  // Reads the next piece of the plaintext into `buffer`: its size, 0 at the end.
  size_t package_offset = 0;
  auto read_piece = [&](std::vector<uint8_t>& buffer) -> absl::StatusOr<size_t> {
    if (is_folder) {
      size_t n = std::min(buffer.size(), package.size() - package_offset);
      std::memcpy(buffer.data(), package.data() + package_offset, n);
      package_offset += n;
      return n;
    }
    for (;;) {
      ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot read model file ", path, ": ", std::strerror(errno)));
      }
      return static_cast<size_t>(n);
    }
  };
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
      endpoints_[session->endpoint].stub->UploadModel(&context, &response);

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
    absl::StatusOr<size_t> n = read_piece(buffer);
    if (!n.ok()) return finish_with(n.status());
    if (*n == 0) break;
    ByteSpan piece(buffer.data(), *n);
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
  if (!status.ok()) {
    absl::Status failure =
        FromGrpc(status, "UploadModel", endpoints_[session->endpoint].address, options_);
    // Not retried, but the next call attests again (on the next node when this one is down).
    if (IsRetryable(failure)) DropSession(session);
    return failure;
  }
  if (!stream_open) {
    return absl::UnavailableError("UploadModel: cloisterd closed the upload stream early");
  }
  api::LoadModelReply reply;
  {
    absl::MutexLock lock(&session->mu);
    RETURN_IF_ERROR(OpenReply(*session->receiver, header, *response.mutable_reply(), reply));
  }
  return std::move(*reply.mutable_model());
}

absl::StatusOr<std::vector<api::ModelInfo>> Client::ListModels() {
  api::ListModelsRequest request;
  api::ListModelsReply reply;
  RETURN_IF_ERROR(
      SealedUnaryCall(crypto::MessageKind::kListModels, "", SerializerOf(request), reply));
  return std::vector<api::ModelInfo>(reply.models().begin(), reply.models().end());
}

absl::Status Client::DeleteModel(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  api::DeleteModelRequest request;
  request.set_name(name);
  api::DeleteModelReply reply;
  return SealedUnaryCall(crypto::MessageKind::kDeleteModel,
                         crypto::ModelHandle(identity_->public_key(), name), SerializerOf(request),
                         reply);
}

absl::StatusOr<std::vector<api::Tensor>> Client::Infer(const std::string& name,
                                                       const std::vector<api::Tensor>& inputs,
                                                       const std::vector<std::string>& outputs,
                                                       absl::Duration timeout) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (inputs.empty()) return absl::InvalidArgumentError("no input tensors given");
  // Check sizes here so a malformed tensor gets a clear local error.
  for (const api::Tensor& input : inputs) RETURN_IF_ERROR(ValidateTensor(input));
  api::InferReplyPayload reply;
  RETURN_IF_ERROR(SealedUnaryCall(
      crypto::MessageKind::kInfer, crypto::ModelHandle(identity_->public_key(), name),
      [&](std::string& buffer) {
        return proto::SerializeInferRequestForSealing(inputs, outputs, buffer);
      },
      reply, timeout));
  return std::vector<api::Tensor>(std::make_move_iterator(reply.mutable_outputs()->begin()),
                                  std::make_move_iterator(reply.mutable_outputs()->end()));
}

}  // namespace cloister::sdk
