#include "crypto/keys.h"

#include <algorithm>

#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HasFlag;
using testing::HexField;
using testing::LoadVectors;
using testing::TestLabel;

Bytes Hex(std::string_view hex) { return *HexDecode(hex); }
Bytes ToVector(const SecretBytes& secret) {
  return Bytes(secret.span().begin(), secret.span().end());
}

// Policy for `acceptable` (shared/testdata/crypto/README.md): a result of all zeros (flags
// ZeroSharedSecret / LowOrderPublic) is refused; every other acceptable case (twist points,
// non-canonical encodings, edge-case scalars) is accepted and must give the listed secret.
TEST(KeysVectors, WycheproofX25519) {
  absl::StatusOr<nlohmann::json> vectors =
      LoadVectors("wycheproof/testvectors_v1/x25519_test.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int matched = 0, zero_refused = 0, invalid_refused = 0;
  for (const auto& group : (*vectors)["testGroups"]) {
    ASSERT_EQ(group["curve"], "curve25519");
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test));
      const Bytes shared = HexField(test, "shared");
      absl::StatusOr<SecretBytes> result =
          X25519(HexField(test, "private"), HexField(test, "public"));
      const bool zero = std::all_of(shared.begin(), shared.end(), [](uint8_t b) { return b == 0; });
      if (test["result"] == "invalid") {
        EXPECT_FALSE(result.ok());
        ++invalid_refused;
      } else if (zero) {
        EXPECT_TRUE(HasFlag(test, "ZeroSharedSecret") || HasFlag(test, "LowOrderPublic"));
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
        ++zero_refused;
      } else {
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(HexEncode(result->span()), HexEncode(shared));
        ++matched;
      }
    }
  }
  EXPECT_EQ(matched + zero_refused + invalid_refused, (*vectors)["numberOfTests"].get<int>());
  EXPECT_EQ(zero_refused, 31);
  std::printf("x25519_test.json: %d matched, %d all-zero secrets refused, %d invalid refused\n",
              matched, zero_refused, invalid_refused);
}

TEST(KeysVectors, WycheproofEd25519) {
  absl::StatusOr<nlohmann::json> vectors =
      LoadVectors("wycheproof/testvectors_v1/ed25519_test.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int accepted = 0, refused = 0;
  for (const auto& group : (*vectors)["testGroups"]) {
    const Bytes public_key = HexField(group["publicKey"], "pk");
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test));
      absl::Status status = Ed25519Verify(public_key, HexField(test, "msg"), HexField(test, "sig"));
      if (test["result"] == "valid") {
        EXPECT_TRUE(status.ok()) << status;
        ++accepted;
      } else {
        ASSERT_EQ(test["result"], "invalid");
        EXPECT_FALSE(status.ok());
        ++refused;
      }
    }
  }
  EXPECT_EQ(accepted + refused, (*vectors)["numberOfTests"].get<int>());
}

// RFC 7748 section 6.1.
TEST(X25519, Rfc7748KeyAgreement) {
  absl::StatusOr<X25519KeyPair> alice =
      X25519FromPrivate(Hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"));
  absl::StatusOr<X25519KeyPair> bob =
      X25519FromPrivate(Hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"));
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_EQ(HexEncode(alice->public_key),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  EXPECT_EQ(HexEncode(bob->public_key),
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  absl::StatusOr<SecretBytes> ab = X25519(alice->private_key.span(), bob->public_key);
  absl::StatusOr<SecretBytes> ba = X25519(bob->private_key.span(), alice->public_key);
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(HexEncode(ab->span()),
            "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  EXPECT_EQ(ToVector(*ab), ToVector(*ba));
}

TEST(X25519, GeneratedPairsAgreeAndBadInputIsRefused) {
  X25519KeyPair a = GenerateX25519();
  X25519KeyPair b = GenerateX25519();
  EXPECT_NE(a.public_key, b.public_key);
  absl::StatusOr<X25519KeyPair> again = X25519FromPrivate(a.private_key.span());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->public_key, a.public_key);
  absl::StatusOr<SecretBytes> ab = X25519(a.private_key.span(), b.public_key);
  absl::StatusOr<SecretBytes> ba = X25519(b.private_key.span(), a.public_key);
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(ToVector(*ab), ToVector(*ba));
  EXPECT_EQ(X25519(a.private_key.span(), Bytes(31)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(X25519(Bytes(33), b.public_key).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(X25519FromPrivate(Bytes(16)).status().code(), absl::StatusCode::kInvalidArgument);
  // The all-zero point and the point of order 2 (u = 1) give an all-zero secret.
  EXPECT_EQ(X25519(a.private_key.span(), Bytes(32, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  Bytes one(32, 0);
  one[0] = 1;
  EXPECT_EQ(X25519(a.private_key.span(), one).status().code(), absl::StatusCode::kInvalidArgument);
}

// RFC 8032 section 7.1, TEST 1 (empty message).
TEST(Ed25519, Rfc8032SignatureIsDeterministic) {
  const Bytes seed = Hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
  absl::StatusOr<Ed25519KeyPair> pair = Ed25519FromSeed(seed);
  ASSERT_TRUE(pair.ok());
  EXPECT_EQ(HexEncode(pair->public_key),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
  absl::StatusOr<Bytes> signature = Ed25519Sign(seed, {});
  ASSERT_TRUE(signature.ok());
  EXPECT_EQ(HexEncode(*signature),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e"
            "39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
  EXPECT_TRUE(Ed25519Verify(pair->public_key, {}, *signature).ok());
}

TEST(Ed25519, SignVerifyAndRefusals) {
  Ed25519KeyPair pair = GenerateEd25519();
  const Bytes message = ToBytes("evidence digest");
  absl::StatusOr<Bytes> signature = Ed25519Sign(pair.seed.span(), message);
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(Ed25519Verify(pair.public_key, message, *signature).ok());
  EXPECT_EQ(Ed25519Verify(pair.public_key, ToBytes("evidence digesT"), *signature).code(),
            absl::StatusCode::kPermissionDenied);
  Bytes bad = *signature;
  bad[10] ^= 4;
  EXPECT_EQ(Ed25519Verify(pair.public_key, message, bad).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Ed25519Verify(pair.public_key, message, ByteSpan(*signature).first(63)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519Verify(Bytes(31), message, *signature).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519Sign(Bytes(64), message).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519FromSeed(Bytes(31)).status().code(), absl::StatusCode::kInvalidArgument);
  // Another key does not verify it.
  EXPECT_EQ(Ed25519Verify(GenerateEd25519().public_key, message, *signature).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace cloister::crypto
