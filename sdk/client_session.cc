// Client (client.h): attestation, opening and replacing sessions, and moving to another
// endpoint (docs/PROTOCOL.md sections 2 and 3).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/binding.h"
#include "attest/nvidia/bundle_verifier.h"
#include "attest/policy.h"
#include "base/status.h"
#include "crypto/channel.h"
#include "crypto/hpke.h"
#include "crypto/random.h"
#include "sdk/client.h"
#include "sdk/client_internal.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;
namespace attest_pb = ::cloister::attest::v1;

using client_internal::CheckConnectionOptions;
using client_internal::FromGrpc;
using client_internal::MakeStub;
using client_internal::PrepareContext;
using client_internal::ResolvePolicy;
using client_internal::SpanOf;
using client_internal::StringOf;

namespace {

// Replace a session this long before it expires, so that a call never races the expiry.
constexpr absl::Duration kExpiryMargin = absl::Seconds(60);
// ...or when this few messages are left of its limit.
constexpr uint64_t kMessageMargin = 16;

const Clock& ClockOf(const ClientOptions& options) {
  return options.clock != nullptr ? *options.clock : *Clock::Real();
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

void Client::DropSession(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  if (session_ == session) session_.reset();
}

}  // namespace cloister::sdk
