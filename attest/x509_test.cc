#include "attest/x509.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "attest/test_util.h"
#include "crypto/ecdsa.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ReadTestText;

absl::Time Utc(int year, int month, int day) {
  return absl::FromCivil(absl::CivilDay(year, month, day), absl::UTCTimeZone());
}

std::unique_ptr<crypto::EcPrivateKey> NewKey() {
  auto key = crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384);
  EXPECT_TRUE(key.ok());
  return std::move(*key);
}

CertificateTemplate Template(std::string name, bool ca) {
  CertificateTemplate spec;
  spec.common_name = std::move(name);
  spec.organization = "Test";
  spec.is_ca = ca;
  spec.not_before = Utc(2024, 1, 1);
  spec.not_after = Utc(2030, 1, 1);
  return spec;
}

// root -> intermediate -> leaf, all P-384.
struct TestPki {
  std::unique_ptr<crypto::EcPrivateKey> root_key = NewKey();
  std::unique_ptr<crypto::EcPrivateKey> ica_key = NewKey();
  std::unique_ptr<crypto::EcPrivateKey> leaf_key = NewKey();
  Certificate root =
      IssueCertificate(Template("Test Root", true), root_key->PublicKeyDer(), nullptr, *root_key)
          .value();
  Certificate ica =
      IssueCertificate(Template("Test ICA", true), ica_key->PublicKeyDer(), &root, *root_key)
          .value();
  Certificate leaf =
      IssueCertificate(Template("Test Leaf", false), leaf_key->PublicKeyDer(), &ica, *ica_key)
          .value();
};

TEST(X509Test, IssuedChainVerifies) {
  TestPki pki;
  EXPECT_TRUE(pki.root.IsCa());
  EXPECT_FALSE(pki.leaf.IsCa());
  EXPECT_EQ(pki.leaf.SubjectCommonName(), "Test Leaf");
  EXPECT_EQ(pki.leaf.IssuerCommonName(), "Test ICA");
  EXPECT_EQ(pki.leaf.PublicKeyDer(), pki.leaf_key->PublicKeyDer());
  EXPECT_EQ(pki.leaf.NotAfter(), Utc(2030, 1, 1));
  EXPECT_EQ(pki.leaf.SerialNumber().size(), 16u);
  auto curve = pki.leaf.KeyCurve();
  ASSERT_TRUE(curve.ok());
  EXPECT_EQ(*curve, crypto::EcCurve::kP384);
  absl::Status status = VerifyChain({pki.leaf, pki.ica, pki.root}, pki.root, Utc(2025, 1, 1));
  EXPECT_TRUE(status.ok()) << status;
  // The root need not be sent.
  EXPECT_TRUE(VerifyChain({pki.leaf, pki.ica}, pki.root, Utc(2025, 1, 1)).ok());
}

TEST(X509Test, ChainFailures) {
  TestPki pki;
  TestPki other;
  // Another root.
  absl::Status status = VerifyChain({pki.leaf, pki.ica, pki.root}, other.root, Utc(2025, 1, 1));
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "Test Root")) << status;
  // Outside the validity window.
  EXPECT_FALSE(VerifyChain({pki.leaf, pki.ica, pki.root}, pki.root, Utc(2031, 1, 1)).ok());
  EXPECT_FALSE(VerifyChain({pki.leaf, pki.ica, pki.root}, pki.root, Utc(2023, 1, 1)).ok());
  // Missing intermediate.
  EXPECT_FALSE(VerifyChain({pki.leaf}, pki.root, Utc(2025, 1, 1)).ok());
  // A CA as the leaf.
  status = VerifyChain({pki.ica, pki.root}, pki.root, Utc(2025, 1, 1));
  EXPECT_TRUE(absl::StrContains(status.message(), "is a CA")) << status;
  // An intermediate from another chain with the same name.
  EXPECT_FALSE(VerifyChain({pki.leaf, other.ica}, pki.root, Utc(2025, 1, 1)).ok());
  EXPECT_FALSE(VerifyChain({}, pki.root, Utc(2025, 1, 1)).ok());
}

TEST(X509Test, EvidenceRootIsNeverTrusted) {
  // An attacker's chain ending in its own self-signed root named like the pinned one.
  TestPki pinned;
  TestPki attacker;
  absl::Status status =
      VerifyChain({attacker.leaf, attacker.ica, attacker.root}, pinned.root, Utc(2025, 1, 1));
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
}

TEST(X509Test, PemChainParsing) {
  TestPki pki;
  std::string pem = ChainToPem({pki.leaf, pki.ica, pki.root});
  auto chain = ParsePemChain("\n" + pem + "\n\n");
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[2].ToDer(), pki.root.ToDer());

  EXPECT_FALSE(ParsePemChain("").ok());
  EXPECT_FALSE(ParsePemChain("garbage").ok());
  EXPECT_FALSE(ParsePemChain(pki.leaf.ToPem() + "garbage\n" + pki.ica.ToPem()).ok());
  EXPECT_FALSE(ParsePemChain(pem, 2).ok());
  std::string truncated = pki.leaf.ToPem();
  truncated.resize(truncated.size() - 30);
  EXPECT_FALSE(ParsePemChain(truncated).ok());
  EXPECT_FALSE(Certificate::FromPem(pem).ok());  // three certificates where one is expected
  EXPECT_FALSE(Certificate::FromDer(Bytes{0x30, 0x00}).ok());
}

TEST(X509Test, SignatureWithCertificateKey) {
  TestPki pki;
  Bytes message = ToBytes("report bytes");
  auto signature = pki.leaf_key->SignP1363(crypto::HashAlg::kSha384, message);
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(
      VerifyP1363WithCertificate(pki.leaf, crypto::HashAlg::kSha384, message, *signature).ok());
  EXPECT_FALSE(
      VerifyP1363WithCertificate(pki.ica, crypto::HashAlg::kSha384, message, *signature).ok());
  Bytes flipped = *signature;
  flipped[10] ^= 1;
  EXPECT_FALSE(
      VerifyP1363WithCertificate(pki.leaf, crypto::HashAlg::kSha384, message, flipped).ok());
}

TEST(X509Test, ExtensionsAndDiceFwid) {
  auto key = NewKey();
  CertificateTemplate spec = Template("Leaf", false);
  Bytes fwid(48, 0x42);
  Bytes dice = der::Sequence({der::Integer(1), der::OctetString(fwid)});
  spec.extensions = {{std::string(kTcgDiceFwidOid), dice},
                     {"1.3.6.1.4.1.3704.1.3.8", der::Integer(213)}};
  auto cert = IssueCertificate(spec, key->PublicKeyDer(), nullptr, *key);
  ASSERT_TRUE(cert.ok()) << cert.status();
  auto value = cert->ExtensionValue(kTcgDiceFwidOid);
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, dice);
  auto extracted = DiceFwid(*cert);
  ASSERT_TRUE(extracted.ok());
  EXPECT_EQ(*extracted, fwid);
  auto spl = cert->ExtensionValue("1.3.6.1.4.1.3704.1.3.8");
  ASSERT_TRUE(spl.ok());
  EXPECT_EQ(der::ParseInteger(*spl).value(), 213u);
  EXPECT_TRUE(absl::IsNotFound(cert->ExtensionValue("1.2.3.4").status()));
  EXPECT_FALSE(cert->ExtensionValue("not an oid").ok());
}

TEST(X509Test, DerHelpers) {
  EXPECT_EQ(HexEncode(der::ObjectId("2.23.133.5.4.1").value()), "0606678105050401");
  EXPECT_EQ(HexEncode(der::ObjectId("2.16.840.1.101.3.4.2.2").value()), "0609608648016503040202");
  EXPECT_FALSE(der::ObjectId("1").ok());
  EXPECT_FALSE(der::ObjectId("1..2").ok());
  EXPECT_EQ(HexEncode(der::Integer(0)), "020100");
  EXPECT_EQ(HexEncode(der::Integer(0x80)), "02020080");
  EXPECT_EQ(HexEncode(der::Integer(115)), "020173");
  for (uint64_t value : {0ull, 1ull, 127ull, 128ull, 255ull, 65536ull, 0xFFFFFFFFFFFFFFFFull}) {
    EXPECT_EQ(der::ParseInteger(der::Integer(value)).value(), value);
  }
  EXPECT_FALSE(der::ParseInteger(Bytes{0x02, 0x02, 0x00, 0x01}).ok());  // non-minimal
  EXPECT_FALSE(der::ParseInteger(Bytes{0x02, 0x01, 0x80}).ok());        // negative
  EXPECT_FALSE(der::ParseInteger(Bytes{0x02, 0x01}).ok());              // truncated
  EXPECT_FALSE(der::ParseInteger(Bytes{0x04, 0x01, 0x01}).ok());        // wrong tag
  EXPECT_FALSE(der::ParseInteger(Bytes{0x02, 0x01, 0x01, 0x00}).ok());  // trailing
  EXPECT_EQ(der::ParseIa5String(der::Ia5String("Milan-B0")).value(), "Milan-B0");
  Bytes long_value(300, 0x61);
  Bytes encoded = der::OctetString(long_value);
  EXPECT_EQ(encoded[1], 0x82);  // long-form length
  EXPECT_EQ(encoded.size(), 304u);
}

TEST(X509RealTest, NvidiaDeviceChainVerifiesToPinnedRoot) {
  auto chain = ParsePemChain(ReadTestText("nvidia-cc/hopper-550.90.07-nras/cert_chain.pem"));
  auto root = Certificate::FromPem(ReadTestText("nvidia-cc/roots/nvidia_device_identity_ca.pem"));
  ASSERT_TRUE(chain.ok() && root.ok());
  ASSERT_EQ(chain->size(), 5u);
  EXPECT_EQ((*chain)[0].SubjectCommonName(), "GH100 A01 GSP FMC LF");
  EXPECT_EQ((*chain)[1].SubjectCommonName(), "GH100 A01 GSP BROM");
  EXPECT_EQ((*chain)[0].SerialDecimal(), "478176379286082186618948445787393647364802107249");
  absl::Status status = VerifyChain(*chain, *root, Utc(2025, 6, 1));
  EXPECT_TRUE(status.ok()) << status;
  auto fwid = DiceFwid((*chain)[0]);
  ASSERT_TRUE(fwid.ok());
  EXPECT_EQ(HexEncode(*fwid),
            "f5c384aebb579217a2c66b17ed0f28e6a9b8d639041acd7b4721cec004f7275494ba94bb5cdfdb3055ee05"
            "1762b1f75d");
  // The RIM root is not the device root.
  auto rim_root =
      Certificate::FromPem(ReadTestText("nvidia-cc/roots/nvidia_corim_signing_root_ca.pem"));
  ASSERT_TRUE(rim_root.ok());
  EXPECT_FALSE(VerifyChain(*chain, *rim_root, Utc(2025, 6, 1)).ok());
}

}  // namespace
}  // namespace cloister::attest
