#include "crypto/hpke.h"

#include <set>

#include "crypto/channel.h"
#include "crypto/keys.h"
#include "crypto/random.h"
#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HexField;
using testing::LoadVectors;

std::string Hex(ByteSpan bytes) { return HexEncode(bytes); }

// RFC 9180 Appendix A, every X25519 set (kem_id 0x20): AES-128-GCM, ChaCha20-Poly1305 and
// export-only, each in all four modes. Procedure of shared/specs/hpke.md section 11.
TEST(HpkeVectors, Rfc9180AppendixA) {
  absl::StatusOr<nlohmann::json> vectors = LoadVectors("hpke/rfc9180_appendix_a.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int sets = 0, encryptions = 0, exports = 0;
  std::set<int> modes_seen, aeads_seen;
  for (const auto& set : *vectors) {
    if (set["kem_id"].get<int>() != 0x20) continue;
    SCOPED_TRACE(set["suite"].get<std::string>() + " mode " +
                 std::to_string(set["mode"].get<int>()));
    const HpkeSuite suite{static_cast<uint16_t>(set["kem_id"].get<int>()),
                          static_cast<uint16_t>(set["kdf_id"].get<int>()),
                          static_cast<uint16_t>(set["aead_id"].get<int>())};
    const auto mode = static_cast<HpkeMode>(set["mode"].get<int>());
    const bool auth = mode == HpkeMode::kAuth || mode == HpkeMode::kAuthPsk;
    const bool psk_mode = mode == HpkeMode::kPsk || mode == HpkeMode::kAuthPsk;
    const bool export_only = suite.aead_id == 0xFFFF;
    modes_seen.insert(set["mode"].get<int>());
    aeads_seen.insert(suite.aead_id);

    // 1. DeriveKeyPair for E, R and (auth modes) S.
    const Bytes ikm_e = HexField(set, "ikmE");
    const Bytes sk_r = HexField(set, "skRm");
    const Bytes pk_r = HexField(set, "pkRm");
    std::vector<std::string> roles = {"E", "R"};
    if (auth) roles.push_back("S");
    for (const std::string& role : roles) {
      absl::StatusOr<std::pair<SecretBytes, Bytes>> pair =
          HpkeDeriveKeyPair(HexField(set, "ikm" + role));
      ASSERT_TRUE(pair.ok()) << pair.status();
      EXPECT_EQ(Hex(pair->first.span()), Hex(HexField(set, "sk" + role + "m"))) << role;
      EXPECT_EQ(Hex(pair->second), Hex(HexField(set, "pk" + role + "m"))) << role;
    }
    const Bytes sk_s = auth ? HexField(set, "skSm") : Bytes();
    const Bytes pk_s = auth ? HexField(set, "pkSm") : Bytes();
    const Bytes psk = psk_mode ? HexField(set, "psk") : Bytes();
    const Bytes psk_id = psk_mode ? HexField(set, "psk_id") : Bytes();
    const Bytes info = HexField(set, "info");

    HpkeOptions sender_options;
    sender_options.mode = mode;
    sender_options.psk = psk;
    sender_options.psk_id = psk_id;
    sender_options.sender_private_key = sk_s;
    sender_options.ephemeral_ikm = ikm_e;
    HpkeOptions receiver_options;
    receiver_options.mode = mode;
    receiver_options.psk = psk;
    receiver_options.psk_id = psk_id;
    receiver_options.sender_public_key = pk_s;

    // 2-3. Encap / Decap: enc and shared secret from both sides.
    absl::StatusOr<std::pair<SecretBytes, Bytes>> encap = HpkeEncapForTest(pk_r, sender_options);
    ASSERT_TRUE(encap.ok()) << encap.status();
    EXPECT_EQ(Hex(encap->second), Hex(HexField(set, "enc")));
    EXPECT_EQ(Hex(encap->first.span()), Hex(HexField(set, "shared_secret")));
    absl::StatusOr<SecretBytes> decap =
        HpkeDecapForTest(HexField(set, "enc"), sk_r, receiver_options);
    ASSERT_TRUE(decap.ok()) << decap.status();
    EXPECT_EQ(Hex(decap->span()), Hex(HexField(set, "shared_secret")));

    // 4. Key schedule.
    absl::StatusOr<std::pair<Bytes, SecretBytes>> schedule =
        HpkeKeyScheduleForTest(suite, HexField(set, "shared_secret"), info, sender_options);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    EXPECT_EQ(Hex(schedule->first), Hex(HexField(set, "key_schedule_context")));
    EXPECT_EQ(Hex(schedule->second.span()), Hex(HexField(set, "secret")));

    absl::StatusOr<HpkeSenderSetup> sender = HpkeSetupSender(suite, pk_r, info, sender_options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    EXPECT_EQ(Hex(sender->enc), Hex(HexField(set, "enc")));
    absl::StatusOr<std::unique_ptr<HpkeContext>> receiver =
        HpkeSetupReceiver(suite, sender->enc, sk_r, info, receiver_options);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    for (const HpkeContext* context : {sender->context.get(), receiver->get()}) {
      EXPECT_EQ(Hex(context->KeyForTest()), Hex(HexField(set, "key")));
      EXPECT_EQ(Hex(context->BaseNonceForTest()), Hex(HexField(set, "base_nonce")));
      EXPECT_EQ(Hex(context->ExporterSecretForTest()), Hex(HexField(set, "exporter_secret")));
    }

    // 5. Encryptions at their explicit sequence numbers.
    for (const auto& encryption : set["encryptions"]) {
      const uint64_t seq = encryption["seq"].get<uint64_t>();
      SCOPED_TRACE("seq " + std::to_string(seq));
      const Bytes pt = HexField(encryption, "pt");
      const Bytes aad = HexField(encryption, "aad");
      const Bytes ct = HexField(encryption, "ct");
      EXPECT_EQ(Hex(SequenceNonce(HexField(set, "base_nonce"), seq)),
                Hex(HexField(encryption, "nonce")));
      sender->context->SetSequenceForTest(seq);
      absl::StatusOr<Bytes> sealed = sender->context->Seal(aad, pt);
      ASSERT_TRUE(sealed.ok()) << sealed.status();
      EXPECT_EQ(Hex(*sealed), Hex(ct));
      // A modified ciphertext or aad fails and leaves the sequence number where it was.
      (*receiver)->SetSequenceForTest(seq);
      Bytes flipped = ct;
      flipped[0] ^= 1;
      EXPECT_EQ((*receiver)->Open(aad, flipped).status().code(), absl::StatusCode::kDataLoss);
      Bytes other_aad = aad;
      other_aad.push_back(0);
      EXPECT_FALSE((*receiver)->Open(other_aad, ct).ok());
      absl::StatusOr<Bytes> opened = (*receiver)->Open(aad, ct);
      ASSERT_TRUE(opened.ok()) << opened.status();
      EXPECT_EQ(Hex(*opened), Hex(pt));
      ++encryptions;
    }
    if (export_only) {
      EXPECT_TRUE(set["encryptions"].empty());
      EXPECT_EQ(sender->context->Seal({}, ToBytes("x")).status().code(),
                absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ((*receiver)->Open({}, Bytes(16)).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }

    // 6. Exports from both contexts.
    for (const auto& item : set["exports"]) {
      const Bytes exporter_context = HexField(item, "exporter_context");
      const size_t length = item["L"].get<size_t>();
      for (const HpkeContext* context : {sender->context.get(), receiver->get()}) {
        absl::StatusOr<SecretBytes> exported = context->Export(exporter_context, length);
        ASSERT_TRUE(exported.ok()) << exported.status();
        EXPECT_EQ(Hex(exported->span()), Hex(HexField(item, "exported_value")));
      }
      ++exports;
    }
    ++sets;
  }
  EXPECT_EQ(sets, 12);
  EXPECT_EQ(modes_seen, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(aeads_seen, (std::set<int>{0x0001, 0x0003, 0xFFFF}));
  std::printf("rfc9180_appendix_a.json: %d X25519 sets, %d encryptions, %d exports\n", sets,
              encryptions, exports);
}

TEST(Hpke, SessionSuiteRoundTrip) {
  X25519KeyPair recipient = GenerateX25519();
  const Bytes info = ToBytes("cloister test");
  absl::StatusOr<HpkeSenderSetup> sender =
      HpkeSetupSender(kSessionSuite, recipient.public_key, info);
  ASSERT_TRUE(sender.ok()) << sender.status();
  absl::StatusOr<std::unique_ptr<HpkeContext>> receiver =
      HpkeSetupReceiver(kSessionSuite, sender->enc, recipient.private_key.span(), info);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  EXPECT_EQ(sender->context->KeyForTest().size(), 32u);
  for (int i = 0; i < 3; ++i) {
    const Bytes message = RandomBytes(100 + i);
    absl::StatusOr<Bytes> sealed = sender->context->Seal(ToBytes("aad"), message);
    ASSERT_TRUE(sealed.ok());
    absl::StatusOr<Bytes> opened = (*receiver)->Open(ToBytes("aad"), *sealed);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, message);
  }
  // Out of order: the receiver is at seq 3, a message sealed at seq 4 does not open.
  ASSERT_TRUE(sender->context->Seal({}, ToBytes("skipped")).ok());
  absl::StatusOr<Bytes> fourth = sender->context->Seal({}, ToBytes("fourth"));
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ((*receiver)->Open({}, *fourth).status().code(), absl::StatusCode::kDataLoss);

  // Fresh ephemeral keys: a second setup gives another enc and other keys.
  absl::StatusOr<HpkeSenderSetup> again =
      HpkeSetupSender(kSessionSuite, recipient.public_key, info);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->enc, sender->enc);

  // A receiver with another info string derives other keys.
  absl::StatusOr<std::unique_ptr<HpkeContext>> wrong_info =
      HpkeSetupReceiver(kSessionSuite, sender->enc, recipient.private_key.span(), ToBytes("x"));
  ASSERT_TRUE(wrong_info.ok());
  EXPECT_NE(Bytes((*wrong_info)->KeyForTest().begin(), (*wrong_info)->KeyForTest().end()),
            Bytes(sender->context->KeyForTest().begin(), sender->context->KeyForTest().end()));
}

TEST(Hpke, MessageLimitAndExportLimit) {
  X25519KeyPair recipient = GenerateX25519();
  absl::StatusOr<HpkeSenderSetup> sender = HpkeSetupSender(kSessionSuite, recipient.public_key, {});
  ASSERT_TRUE(sender.ok());
  sender->context->SetSequenceForTest(~uint64_t{0});
  EXPECT_EQ(sender->context->Seal({}, {}).status().code(), absl::StatusCode::kResourceExhausted);
  sender->context->SetSequenceForTest(~uint64_t{0} - 1);
  EXPECT_TRUE(sender->context->Seal({}, {}).ok());
  EXPECT_EQ(sender->context->Seal({}, {}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(sender->context->Export({}, 255 * 32).ok());
  EXPECT_EQ(sender->context->Export({}, 255 * 32 + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Hpke, RefusesBadSuitesKeysAndModeInputs) {
  X25519KeyPair recipient = GenerateX25519();
  X25519KeyPair sender_static = GenerateX25519();
  const Bytes psk(32, 9), psk_id = ToBytes("id");
  auto setup = [&](const HpkeSuite& suite, ByteSpan public_key, const HpkeOptions& options) {
    return HpkeSetupSender(suite, public_key, {}, options).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(setup(HpkeSuite{0x0010, 1, 2}, recipient.public_key, {}), kInvalid);
  EXPECT_EQ(setup(HpkeSuite{0x0020, 3, 2}, recipient.public_key, {}), kInvalid);
  EXPECT_EQ(setup(HpkeSuite{0x0020, 1, 4}, recipient.public_key, {}), kInvalid);
  EXPECT_EQ(setup(kSessionSuite, Bytes(31, 1), {}), kInvalid);
  // Low-order recipient keys give an all-zero DH result.
  EXPECT_EQ(setup(kSessionSuite, Bytes(32, 0), {}), kInvalid);

  HpkeOptions options;
  options.mode = HpkeMode::kPsk;
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, options), kInvalid);  // psk missing
  options.psk = psk;
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, options), kInvalid);  // psk_id missing
  options.psk_id = psk_id;
  EXPECT_TRUE(HpkeSetupSender(kSessionSuite, recipient.public_key, {}, options).ok());
  options.psk = ByteSpan(psk).first(16);
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, options), kInvalid);  // psk too short
  options.mode = HpkeMode::kBase;
  options.psk = psk;
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, options), kInvalid);  // psk not used

  HpkeOptions auth;
  auth.mode = HpkeMode::kAuth;
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, auth), kInvalid);  // no sender key
  auth.sender_private_key = sender_static.private_key.span();
  absl::StatusOr<HpkeSenderSetup> sent =
      HpkeSetupSender(kSessionSuite, recipient.public_key, {}, auth);
  ASSERT_TRUE(sent.ok());
  HpkeOptions base_with_key;
  base_with_key.sender_private_key = sender_static.private_key.span();
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, base_with_key), kInvalid);
  EXPECT_EQ(setup(kSessionSuite, recipient.public_key, HpkeOptions{static_cast<HpkeMode>(4)}),
            kInvalid);

  // Receiver side: enc size, key size, missing or wrong sender public key.
  HpkeOptions receive_auth;
  receive_auth.mode = HpkeMode::kAuth;
  EXPECT_EQ(
      HpkeSetupReceiver(kSessionSuite, sent->enc, recipient.private_key.span(), {}, receive_auth)
          .status()
          .code(),
      kInvalid);
  receive_auth.sender_public_key = sender_static.public_key;
  EXPECT_EQ(
      HpkeSetupReceiver(kSessionSuite, Bytes(33), recipient.private_key.span(), {}, receive_auth)
          .status()
          .code(),
      kInvalid);
  EXPECT_EQ(
      HpkeSetupReceiver(kSessionSuite, sent->enc, Bytes(31), {}, receive_auth).status().code(),
      kInvalid);
  absl::StatusOr<std::unique_ptr<HpkeContext>> received =
      HpkeSetupReceiver(kSessionSuite, sent->enc, recipient.private_key.span(), {}, receive_auth);
  ASSERT_TRUE(received.ok()) << received.status();
  absl::StatusOr<Bytes> sealed = sent->context->Seal({}, ToBytes("authenticated"));
  ASSERT_TRUE(sealed.ok());
  EXPECT_TRUE((*received)->Open({}, *sealed).ok());
  // A wrong sender public key is not an error at setup, only at Open (RFC 9180 section 5.1.3).
  const X25519KeyPair impostor_key = GenerateX25519();
  receive_auth.sender_public_key = impostor_key.public_key;
  absl::StatusOr<std::unique_ptr<HpkeContext>> impostor =
      HpkeSetupReceiver(kSessionSuite, sent->enc, recipient.private_key.span(), {}, receive_auth);
  ASSERT_TRUE(impostor.ok());
  EXPECT_EQ((*impostor)->Open({}, *sealed).status().code(), absl::StatusCode::kDataLoss);

  EXPECT_EQ(HpkeDeriveKeyPair(Bytes(31)).status().code(), kInvalid);
}

}  // namespace
}  // namespace cloister::crypto
