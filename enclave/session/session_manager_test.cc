// SessionManager on its own, against a client built from the same crypto the SDK uses: a session
// opens only for the tenant that sealed its hello and only once; an item opens only in a session
// of the tenant the host names, only for the kind it was sealed for, and only once, inside the
// replay window; sessions end at their lifetime and message limit; and refusals change no state.
#include "enclave/session/session_manager.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "base/clock.h"
#include "crypto/channel.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "crypto/random.h"
#include "gtest/gtest.h"

namespace cloister::enclave {
namespace {

using boundary::v1::ForwardedRequest;

// One tenant's end of a session: its OpenSession inputs, then its channel once opened.
struct Client {
  std::string tenant;
  Bytes hpke_enc;
  Bytes sealed_hello;
  std::unique_ptr<crypto::HpkeContext> context;
  Bytes session_id;
  std::unique_ptr<crypto::ChannelSender> sender;
  std::unique_ptr<crypto::ChannelReceiver> receiver;
};

class SessionManagerTest : public ::testing::Test {
 protected:
  SessionManagerTest() : keys_(EnclaveKeys::Generate()), digest_(crypto::RandomBytes(32)) { Reset({}); }

  void Reset(SessionLimits limits) {
    sessions_ = std::make_unique<SessionManager>(&keys_, &clock_, limits);
  }

  // A hello from `tenant`, sealed for the enclave's key and evidence digest with `aad_tenant`
  // (the tenant the host will name) as the HPKE associated data.
  Client Hello(const std::string& tenant, const std::string& aad_tenant) {
    Client client;
    client.tenant = tenant;
    auto setup = crypto::HpkeSetupSender(crypto::kSessionSuite, keys_.hpke_public_key,
                                         crypto::SessionHpkeInfo(digest_));
    EXPECT_TRUE(setup.ok()) << setup.status();
    crypto::Ed25519KeyPair identity = crypto::GenerateEd25519();
    api::v1::SessionHello hello;
    hello.set_tenant_id(tenant);
    hello.set_identity_public_key(ToString(identity.public_key));
    hello.set_client_nonce(ToString(crypto::RandomBytes(32)));
    Bytes transcript = crypto::SessionTranscript(digest_, keys_.hpke_public_key,
                                                 keys_.signing_public_key, identity.public_key,
                                                 setup->enc, AsBytes(hello.client_nonce()), tenant);
    auto signature = crypto::Ed25519Sign(identity.seed.span(), transcript);
    EXPECT_TRUE(signature.ok()) << signature.status();
    hello.set_transcript_signature(ToString(*signature));
    auto sealed = setup->context->Seal(AsBytes(aad_tenant), AsBytes(hello.SerializeAsString()));
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    client.hpke_enc = setup->enc;
    client.sealed_hello = *sealed;
    client.context = std::move(setup->context);
    return client;
  }

  absl::StatusOr<boundary::v1::OpenSessionResult> Open(const std::string& host_tenant,
                                                       const Client& client) {
    return sessions_->Open(host_tenant, client.hpke_enc, client.sealed_hello, digest_);
  }

  // A client of `tenant` with an open session, its welcome checked.
  std::unique_ptr<Client> OpenClient(const std::string& tenant) {
    auto client = std::make_unique<Client>(Hello(tenant, tenant));
    auto opened = Open(tenant, *client);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return nullptr;
    auto keys = crypto::DeriveChannelKeys(*client->context);
    EXPECT_TRUE(keys.ok()) << keys.status();
    EXPECT_EQ(ToString(keys->session_id), opened->session_id());
    client->session_id = keys->session_id;
    client->sender = std::make_unique<crypto::ChannelSender>(
        keys->session_id, crypto::Direction::kClientToEnclave, keys->client_to_enclave_key.span(),
        keys->client_to_enclave_nonce.span());
    client->receiver = std::make_unique<crypto::ChannelReceiver>(
        keys->session_id, crypto::Direction::kEnclaveToClient, keys->enclave_to_client_key.span(),
        keys->enclave_to_client_nonce.span());
    auto welcome =
        client->receiver->Open(opened->sequence(), {crypto::MessageKind::kWelcome, "", ""},
                               AsBytes(opened->sealed_welcome()));
    EXPECT_TRUE(welcome.ok()) << welcome.status();
    return client;
  }

  // `body` sealed by `client` as message `sequence` of `kind`.
  static ForwardedRequest Seal(Client& client, uint64_t sequence, const std::string& body,
                         crypto::MessageKind kind = crypto::MessageKind::kInfer) {
    ForwardedRequest item;
    item.set_session_id(ToString(client.session_id));
    item.set_request_id("request-" + std::to_string(sequence));
    item.set_model_handle("handle");
    client.sender->SetNextSequenceForTest(sequence);
    auto sealed =
        client.sender->Seal({kind, item.request_id(), item.model_handle()}, AsBytes(body));
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_EQ(sealed->first, sequence);
    item.set_sequence(sealed->first);
    item.set_ciphertext(ToString(sealed->second));
    return item;
  }

  // Opens a copy of `item` (OpenItem opens in place) and returns its plaintext.
  absl::StatusOr<std::string> OpenCopy(const ForwardedRequest& item, const std::string& tenant,
                                       crypto::MessageKind kind = crypto::MessageKind::kInfer) {
    ForwardedRequest copy = item;
    auto opened = sessions_->OpenItem(copy, kind, tenant);
    if (!opened.ok()) return opened.status();
    return std::string(reinterpret_cast<const char*>(opened->plaintext.data()),
                       opened->plaintext.size());
  }

  FakeClock clock_;
  EnclaveKeys keys_;
  Bytes digest_;
  std::unique_ptr<SessionManager> sessions_;
};

void ExpectRefused(const absl::StatusOr<std::string>& opened, absl::StatusCode code,
                   absl::string_view message) {
  ASSERT_FALSE(opened.ok()) << "opened: " << *opened;
  EXPECT_EQ(opened.status().code(), code) << opened.status();
  EXPECT_TRUE(absl::StrContains(opened.status().message(), message)) << opened.status();
}

TEST_F(SessionManagerTest, AnItemOpensOnceAndItsReplayIsRefused) {
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  const ForwardedRequest item = Seal(*alpha, 0, "first request");
  auto opened = OpenCopy(item, "alpha");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, "first request");
  ExpectRefused(OpenCopy(item, "alpha"), absl::StatusCode::kPermissionDenied,
                "replayed message refused: sequence 0 was already received");
  // A fresh sequence number still opens.
  EXPECT_TRUE(OpenCopy(Seal(*alpha, 1, "second"), "alpha").ok());
}

TEST_F(SessionManagerTest, TheReplayWindowAcceptsLateMessagesUpToItsEdge) {
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  const uint64_t highest = crypto::kReplayWindow + 10;
  const ForwardedRequest edge = Seal(*alpha, highest - (crypto::kReplayWindow - 1), "at the edge");
  const ForwardedRequest too_old = Seal(*alpha, highest - crypto::kReplayWindow, "one past it");
  const ForwardedRequest late = Seal(*alpha, highest - 5, "late");
  ASSERT_TRUE(OpenCopy(Seal(*alpha, highest, "newest"), "alpha").ok());

  // Not seen yet and inside the window: accepted out of order, once.
  EXPECT_TRUE(OpenCopy(late, "alpha").ok());
  ExpectRefused(OpenCopy(late, "alpha"), absl::StatusCode::kPermissionDenied, "already received");
  EXPECT_TRUE(OpenCopy(edge, "alpha").ok());
  ExpectRefused(OpenCopy(too_old, "alpha"), absl::StatusCode::kPermissionDenied,
                "is older than the replay window");
  // A newer message moves the window on: the old edge falls out of it.
  ASSERT_TRUE(OpenCopy(Seal(*alpha, highest + 1, "newer still"), "alpha").ok());
  ExpectRefused(OpenCopy(Seal(*alpha, highest - (crypto::kReplayWindow - 1), "again"), "alpha"),
                absl::StatusCode::kPermissionDenied, "is older than the replay window");
}

TEST_F(SessionManagerTest, ASessionServesOnlyTheTenantThatOpenedIt) {
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  auto beta = OpenClient("beta");
  ASSERT_NE(beta, nullptr);
  const ForwardedRequest item = Seal(*alpha, 0, "alpha's request");
  // The host naming another tenant is refused exactly as an unknown session, and the refusal
  // consumes nothing: the item still opens for its own tenant.
  ExpectRefused(OpenCopy(item, "beta"), absl::StatusCode::kNotFound,
                "unknown or expired session; open a new session");
  ExpectRefused(OpenCopy(item, ""), absl::StatusCode::kNotFound, "unknown or expired session");
  EXPECT_TRUE(OpenCopy(item, "alpha").ok());

  // Another session's id on alpha's ciphertext does not authenticate.
  ForwardedRequest moved = Seal(*alpha, 1, "moved");
  moved.set_session_id(ToString(beta->session_id));
  ExpectRefused(OpenCopy(moved, "beta"), absl::StatusCode::kDataLoss, "");
}

TEST_F(SessionManagerTest, AHelloOpensOnlyForTheTenantThatSealedIt) {
  // The host names beta for alpha's hello: the hello's associated data is the tenant.
  auto renamed = Open("beta", Hello("alpha", "alpha"));
  ASSERT_FALSE(renamed.ok());
  EXPECT_EQ(renamed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(renamed.status().message(),
            "open session: sealed hello does not authenticate (wrong enclave key, evidence or "
            "tenant)");
  // Sealed for beta but naming alpha inside.
  auto inside = Open("beta", Hello("alpha", "beta"));
  ASSERT_FALSE(inside.ok());
  EXPECT_EQ(inside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(inside.status().message(), "open session: hello names another tenant than the caller");
  EXPECT_EQ(sessions_->session_count(), 0u);

  // The same hello twice: the second is a replay.
  const Client client = Hello("alpha", "alpha");
  ASSERT_TRUE(Open("alpha", client).ok());
  auto again = Open("alpha", client);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(sessions_->session_count(), 1u);
}

TEST_F(SessionManagerTest, MalformedOpenCallsAreRefusedByName) {
  Client client = Hello("alpha", "alpha");
  auto empty = sessions_->Open("", client.hpke_enc, client.sealed_hello, digest_);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "open session: empty tenant id");

  const Bytes short_enc(client.hpke_enc.begin(), client.hpke_enc.end() - 1);
  auto truncated = sessions_->Open("alpha", short_enc, client.sealed_hello, digest_);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(truncated.status().message(),
            "open session: HPKE encapsulated key is 31 bytes, not 32");

  // Over other evidence than the hello was sealed to.
  auto stale =
      sessions_->Open("alpha", client.hpke_enc, client.sealed_hello, crypto::RandomBytes(32));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kPermissionDenied) << stale.status();
}

TEST_F(SessionManagerTest, AnItemOpensOnlyAsTheKindItWasSealedFor) {
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  const ForwardedRequest item = Seal(*alpha, 0, "an inference", crypto::MessageKind::kInfer);
  ExpectRefused(OpenCopy(item, "alpha", crypto::MessageKind::kLoadModel),
                absl::StatusCode::kDataLoss, "");
  // The failed open recorded nothing: the genuine kind still opens it.
  EXPECT_TRUE(OpenCopy(item, "alpha", crypto::MessageKind::kInfer).ok());
}

TEST_F(SessionManagerTest, SessionsExpireAtTheirLifetime) {
  Reset({.lifetime = absl::Minutes(10)});
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  const ForwardedRequest item = Seal(*alpha, 0, "request");
  clock_.Advance(absl::Minutes(10) - absl::Seconds(1));
  ASSERT_TRUE(sessions_->Find(alpha->session_id).ok());
  clock_.Advance(absl::Seconds(1));
  auto found = sessions_->Find(alpha->session_id);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().message(), "unknown or expired session; open a new session");
  ExpectRefused(OpenCopy(item, "alpha"), absl::StatusCode::kNotFound, "expired session");
  EXPECT_EQ(sessions_->session_count(), 0u);
}

TEST_F(SessionManagerTest, SessionsEndAtTheirMessageLimitAndTheTableAtItsSize) {
  Reset({.max_messages = 2, .max_sessions = 1});
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_TRUE(OpenCopy(Seal(*alpha, 0, "one"), "alpha").ok());
  EXPECT_TRUE(OpenCopy(Seal(*alpha, 1, "two"), "alpha").ok());
  ExpectRefused(OpenCopy(Seal(*alpha, 2, "three"), "alpha"), absl::StatusCode::kFailedPrecondition,
                "session message limit reached");

  auto full = Open("beta", Hello("beta", "beta"));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.status().message(), "open session: the enclave holds its maximum of 1 sessions");
}

TEST_F(SessionManagerTest, RepliesAreSealedInOrderForTheClient) {
  auto alpha = OpenClient("alpha");
  ASSERT_NE(alpha, nullptr);
  const ForwardedRequest item = Seal(*alpha, 0, "request");
  auto session = sessions_->Find(alpha->session_id);
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint64_t want : {1, 2}) {  // the welcome was message 0
    auto reply = sessions_->SealReply(**session, item, crypto::MessageKind::kInfer,
                                      MakeEnvelope(absl::NotFoundError("model not found")));
    ASSERT_FALSE(reply.has_status()) << reply.status().message();
    EXPECT_EQ(reply.request_id(), item.request_id());
    EXPECT_EQ(reply.sequence(), want);
    auto opened = alpha->receiver->Open(
        reply.sequence(), {crypto::MessageKind::kInfer, item.request_id(), item.model_handle()},
        AsBytes(reply.ciphertext()));
    ASSERT_TRUE(opened.ok()) << opened.status();
    api::v1::ReplyEnvelope envelope;
    ASSERT_TRUE(envelope.ParseFromArray(opened->data(), static_cast<int>(opened->size())));
    EXPECT_EQ(envelope.code(), static_cast<int>(absl::StatusCode::kNotFound));
    EXPECT_EQ(envelope.message(), "model not found");
  }
}

}  // namespace
}  // namespace cloister::enclave
