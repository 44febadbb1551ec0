// Client (client.h): the connection options, TLS credentials and gRPC channels, the mapping of
// gRPC errors, the server list, and Connect. Attestation and sessions are in client_session.cc,
// the sealed calls in client_sealed_call.cc, client_upload.cc and client_calls.cc.
#include "sdk/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "proto/error_reason.h"
#include "sdk/client_internal.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;
namespace attest_pb = ::cloister::attest::v1;

namespace client_internal {
namespace {

constexpr int kMaxMessageSize = 1 << 30;

// gRPC metadata values must be printable ASCII without spaces for these two fields.
bool IsMetadataSafe(absl::string_view value) {
  if (value.empty()) return false;
  for (char c : value) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

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

namespace {

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

}  // namespace

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
                    absl::Duration timeout) {
  context.AddMetadata("x-cloister-tenant", options.tenant_id);
  if (!options.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
  }
  if (with_deadline) {
    absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options.call_timeout;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(limit));
  }
}

namespace {

// FromGrpc's code and message.
absl::Status FromGrpcCode(const grpc::Status& status, absl::string_view rpc,
                          absl::string_view server, const ClientOptions& options,
                          absl::Duration timeout) {
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

}  // namespace

absl::Status FromGrpc(const grpc::Status& status, absl::string_view rpc, absl::string_view server,
                      const ClientOptions& options, absl::Duration timeout) {
  return proto::WithReason(FromGrpcCode(status, rpc, server, options, timeout),
                           proto::ReasonFromGrpcDetails(status.error_details()));
}

std::string NewRequestId() { return HexEncode(crypto::RandomBytes(8)); }

ByteSpan SpanOf(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string StringOf(ByteSpan b) { return ToString(b); }

void WipeString(std::string& s) {
  SecureWipe(s.data(), s.size());
  s.clear();
}

}  // namespace client_internal

using client_internal::CheckConnectionOptions;
using client_internal::MakeStub;
using client_internal::ResolvePolicy;

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

Client::Client(ClientOptions options, std::shared_ptr<const TenantIdentity> identity,
               attest_pb::Policy policy, std::vector<Endpoint> endpoints)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      policy_(std::move(policy)),
      endpoints_(std::move(endpoints)) {
  CLOISTER_CHECK(!endpoints_.empty());
}

Client::~Client() = default;

size_t SpreadStart(const Bytes& identity_public_key, size_t endpoints) {
  if (endpoints <= 1) return 0;
  const Bytes digest = crypto::Sha256(identity_public_key);
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | digest[i];
  return static_cast<size_t>(value % endpoints);
}

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
  for (std::string& server : servers) {
    ASSIGN_OR_RETURN(std::unique_ptr<api::Cloister::Stub> stub, MakeStub(options, server));
    endpoints.push_back(Endpoint{std::move(server), std::move(stub)});
  }
  const size_t start =
      options.spread_endpoints ? SpreadStart(identity->public_key(), endpoints.size()) : 0;
  std::vector<size_t> order;
  for (size_t i = 0; i < endpoints.size(); ++i) order.push_back((start + i) % endpoints.size());
  std::unique_ptr<Client> client(
      new Client(options, std::move(identity), std::move(policy), std::move(endpoints)));
  {
    absl::MutexLock reopen_lock(&client->reopen_mu_);
    RETURN_IF_ERROR(client->OpenSessionOnFirstOf(order, verdict_out).status());
  }
  return client;
}

attest::Verdict Client::verdict() const {
  absl::MutexLock lock(&mu_);
  return verdict_;
}

std::string Client::ModelHandleFor(const std::string& name) const {
  {
    absl::MutexLock lock(&mu_);
    if (verdict_.published_models.count(name) != 0) return crypto::PublishedModelHandle(name);
  }
  return crypto::ModelHandle(identity_->public_key(), name);
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

}  // namespace cloister::sdk
