#include "crypto/ecdsa.h"

#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HexField;
using testing::LoadVectors;
using testing::TestLabel;

enum class SignatureFormat { kP1363, kDer };

// Every test is checked twice: with the group's key as an uncompressed point and as DER
// SubjectPublicKeyInfo. valid must verify, invalid must not (these files have no acceptable).
void RunEcdsaFile(const std::string& relative, EcCurve curve, HashAlg hash,
                  const std::string& curve_name, const std::string& sha_name,
                  SignatureFormat format) {
  absl::StatusOr<nlohmann::json> vectors = LoadVectors(relative);
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int accepted = 0, refused = 0;
  for (const auto& group : (*vectors)["testGroups"]) {
    ASSERT_EQ(group["publicKey"]["curve"], curve_name);
    ASSERT_EQ(group["sha"], sha_name);
    const Bytes point = HexField(group["publicKey"], "uncompressed");
    const Bytes der_key = HexField(group, "publicKeyDer");
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test));
      const Bytes msg = HexField(test, "msg");
      const Bytes sig = HexField(test, "sig");
      for (const Bytes* key : {&point, &der_key}) {
        SCOPED_TRACE(key == &point ? "uncompressed point" : "DER key");
        absl::Status status = format == SignatureFormat::kP1363
                                  ? EcdsaVerifyP1363(curve, hash, *key, msg, sig)
                                  : EcdsaVerifyDer(curve, hash, *key, msg, sig);
        if (test["result"] == "valid") {
          EXPECT_TRUE(status.ok()) << status;
        } else {
          ASSERT_EQ(test["result"], "invalid");
          EXPECT_FALSE(status.ok());
          if (!status.ok()) {
            EXPECT_TRUE(status.code() == absl::StatusCode::kPermissionDenied ||
                        status.code() == absl::StatusCode::kInvalidArgument)
                << status;
          }
        }
      }
      (test["result"] == "valid" ? accepted : refused)++;
    }
  }
  EXPECT_EQ(accepted + refused, (*vectors)["numberOfTests"].get<int>());
}

TEST(EcdsaVectors, WycheproofP384Sha384P1363) {
  RunEcdsaFile("wycheproof/testvectors_v1/ecdsa_secp384r1_sha384_p1363_test.json", EcCurve::kP384,
               HashAlg::kSha384, "secp384r1", "SHA-384", SignatureFormat::kP1363);
}
TEST(EcdsaVectors, WycheproofP256Sha256P1363) {
  RunEcdsaFile("wycheproof/testvectors_v1/ecdsa_secp256r1_sha256_p1363_test.json", EcCurve::kP256,
               HashAlg::kSha256, "secp256r1", "SHA-256", SignatureFormat::kP1363);
}
TEST(EcdsaVectors, WycheproofP384Sha384Der) {
  RunEcdsaFile("wycheproof/testvectors_v1/ecdsa_secp384r1_sha384_test.json", EcCurve::kP384,
               HashAlg::kSha384, "secp384r1", "SHA-384", SignatureFormat::kDer);
}
TEST(EcdsaVectors, WycheproofP256Sha256Der) {
  RunEcdsaFile("wycheproof/testvectors_v1/ecdsa_secp256r1_sha256_test.json", EcCurve::kP256,
               HashAlg::kSha256, "secp256r1", "SHA-256", SignatureFormat::kDer);
}

class EcdsaKeyTest : public ::testing::TestWithParam<EcCurve> {};

TEST_P(EcdsaKeyTest, SignVerifyAndPemRoundTrip) {
  const EcCurve curve = GetParam();
  const HashAlg hash = curve == EcCurve::kP384 ? HashAlg::kSha384 : HashAlg::kSha256;
  const size_t scalar_size = curve == EcCurve::kP384 ? 48 : 32;
  absl::StatusOr<std::unique_ptr<EcPrivateKey>> key = EcPrivateKey::Generate(curve);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ((*key)->curve(), curve);
  const Bytes message = ToBytes("GPU measurement report");
  absl::StatusOr<Bytes> signature = (*key)->SignP1363(hash, message);
  ASSERT_TRUE(signature.ok()) << signature.status();
  ASSERT_EQ(signature->size(), 2 * scalar_size);
  const Bytes public_der = (*key)->PublicKeyDer();
  EXPECT_TRUE(EcdsaVerifyP1363(curve, hash, public_der, message, *signature).ok());
  EXPECT_EQ(EcdsaVerifyP1363(curve, hash, public_der, ToBytes("other"), *signature).code(),
            absl::StatusCode::kPermissionDenied);
  // The signature is bound to the hash.
  EXPECT_FALSE(EcdsaVerifyP1363(curve, HashAlg::kSha512, public_der, message, *signature).ok());
  // Wrong lengths are malformed, not merely wrong.
  EXPECT_EQ(EcdsaVerifyP1363(curve, hash, public_der, message,
                             ByteSpan(*signature).first(signature->size() - 1))
                .code(),
            absl::StatusCode::kInvalidArgument);

  const std::string pem = (*key)->ToPem();
  EXPECT_NE(pem.find("-----BEGIN PRIVATE KEY-----"), std::string::npos);
  absl::StatusOr<std::unique_ptr<EcPrivateKey>> reloaded = EcPrivateKey::FromPem(pem);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ((*reloaded)->curve(), curve);
  EXPECT_EQ((*reloaded)->PublicKeyDer(), public_der);
  absl::StatusOr<Bytes> second = (*reloaded)->SignP1363(hash, message);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(EcdsaVerifyP1363(curve, hash, public_der, message, *second).ok());
}

TEST_P(EcdsaKeyTest, KeyOnTheOtherCurveIsRefused) {
  const EcCurve curve = GetParam();
  const EcCurve other = curve == EcCurve::kP256 ? EcCurve::kP384 : EcCurve::kP256;
  absl::StatusOr<std::unique_ptr<EcPrivateKey>> key = EcPrivateKey::Generate(other);
  ASSERT_TRUE(key.ok());
  absl::StatusOr<Bytes> signature = (*key)->SignP1363(HashAlg::kSha256, ToBytes("m"));
  ASSERT_TRUE(signature.ok());
  absl::Status status =
      EcdsaVerifyDer(curve, HashAlg::kSha256, (*key)->PublicKeyDer(), ToBytes("m"),
                     Bytes{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

INSTANTIATE_TEST_SUITE_P(BothCurves, EcdsaKeyTest,
                         ::testing::Values(EcCurve::kP256, EcCurve::kP384),
                         [](const ::testing::TestParamInfo<EcCurve>& info) {
                           return std::string(info.param == EcCurve::kP256 ? "P256" : "P384");
                         });

TEST(Ecdsa, MalformedKeysAndPemAreRefused) {
  const Bytes signature(64, 1);
  const Bytes message = ToBytes("m");
  EXPECT_EQ(EcdsaVerifyP1363(EcCurve::kP256, HashAlg::kSha256, Bytes(65, 0x04), message, signature)
                .code(),
            absl::StatusCode::kInvalidArgument);  // not on the curve
  EXPECT_EQ(EcdsaVerifyP1363(EcCurve::kP256, HashAlg::kSha256, Bytes(33, 0x02), message, signature)
                .code(),
            absl::StatusCode::kInvalidArgument);  // compressed points are not accepted
  EXPECT_EQ(EcdsaVerifyP1363(EcCurve::kP256, HashAlg::kSha256, {}, message, signature).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EcdsaVerifyP1363(EcCurve::kP256, HashAlg::kSha256, Bytes{0x30, 0x03, 0x01, 0x01, 0x00},
                             message, signature)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EcPrivateKey::FromPem("not a pem").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EcPrivateKey::FromPem("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cloister::crypto
