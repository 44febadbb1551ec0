#include "crypto/hkdf.h"

#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HexField;
using testing::LoadVectors;
using testing::TestLabel;

Bytes ToVector(const SecretBytes& secret) {
  return Bytes(secret.span().begin(), secret.span().end());
}

// RFC 5869 Appendix A. Cases 4-7 use SHA-1, which Cloister does not offer, so only the three
// SHA-256 cases apply; each checks PRK and OKM.
TEST(HkdfVectors, Rfc5869) {
  absl::StatusOr<nlohmann::json> vectors = LoadVectors("rfc5869/hkdf_rfc5869.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int checked = 0;
  for (const auto& test : (*vectors)["tests"]) {
    if (test["hash"] != "SHA-256") continue;
    SCOPED_TRACE(test.value("rfcSection", ""));
    const Bytes ikm = HexField(test, "ikm");
    const Bytes salt = HexField(test, "salt");
    const Bytes info = HexField(test, "info");
    const size_t length = test["length"].get<size_t>();
    SecretBytes prk = HkdfExtract(HashAlg::kSha256, salt, ikm);
    EXPECT_EQ(HexEncode(prk.span()), HexEncode(HexField(test, "prk")));
    absl::StatusOr<SecretBytes> okm = HkdfExpand(HashAlg::kSha256, prk.span(), info, length);
    ASSERT_TRUE(okm.ok()) << okm.status();
    EXPECT_EQ(HexEncode(okm->span()), HexEncode(HexField(test, "okm")));
    absl::StatusOr<SecretBytes> full = Hkdf(HashAlg::kSha256, salt, ikm, info, length);
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_EQ(ToVector(*full), ToVector(*okm));
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(HkdfVectors, WycheproofHkdfSha256) {
  absl::StatusOr<nlohmann::json> vectors =
      LoadVectors("wycheproof/testvectors_v1/hkdf_sha256_test.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int valid = 0, invalid = 0;
  for (const auto& group : (*vectors)["testGroups"]) {
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test));
      absl::StatusOr<SecretBytes> okm =
          Hkdf(HashAlg::kSha256, HexField(test, "salt"), HexField(test, "ikm"),
               HexField(test, "info"), test["size"].get<size_t>());
      if (test["result"] == "valid") {
        ASSERT_TRUE(okm.ok()) << okm.status();
        EXPECT_EQ(HexEncode(okm->span()), HexEncode(HexField(test, "okm")));
        ++valid;
      } else {
        EXPECT_FALSE(okm.ok());
        if (!okm.ok()) {
          EXPECT_EQ(okm.status().code(), absl::StatusCode::kInvalidArgument);
        }
        ++invalid;
      }
    }
  }
  EXPECT_EQ(valid + invalid, (*vectors)["numberOfTests"].get<int>());
  EXPECT_EQ(invalid, 3);
}

TEST(Hkdf, EmptySaltIsHashSizeZeros) {
  const Bytes ikm = ToBytes("input keying material");
  SecretBytes empty_salt = HkdfExtract(HashAlg::kSha512, {}, ikm);
  SecretBytes zero_salt = HkdfExtract(HashAlg::kSha512, Bytes(64, 0), ikm);
  EXPECT_EQ(ToVector(empty_salt), ToVector(zero_salt));
  EXPECT_EQ(empty_salt.size(), 64u);
}

TEST(Hkdf, ExpandRefusesTooLongOutputAndShortPrk) {
  const Bytes prk(32, 7);
  EXPECT_TRUE(HkdfExpand(HashAlg::kSha256, prk, {}, 255 * 32).ok());
  EXPECT_EQ(HkdfExpand(HashAlg::kSha256, prk, {}, 255 * 32 + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HkdfExpand(HashAlg::kSha256, Bytes(31, 7), {}, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HkdfExpand(HashAlg::kSha512, prk, {}, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<SecretBytes> empty = HkdfExpand(HashAlg::kSha256, prk, {}, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(Hkdf, ExpandWithKeyTakesShortKeysAndIsAPrefixOfLongerOutput) {
  const Bytes key(32, 0x42);
  absl::StatusOr<SecretBytes> short_okm =
      HkdfExpandWithKey(HashAlg::kSha512, key, ToBytes("x"), 76);
  absl::StatusOr<SecretBytes> long_okm =
      HkdfExpandWithKey(HashAlg::kSha512, key, ToBytes("x"), 200);
  ASSERT_TRUE(short_okm.ok() && long_okm.ok());
  EXPECT_EQ(ToVector(*short_okm), Bytes(long_okm->span().begin(), long_okm->span().begin() + 76));
  // Same as plain HMAC for the first block: T(1) = HMAC(key, info || 0x01).
  Bytes block_input = ToBytes("x");
  block_input.push_back(1);
  const Bytes t1 = Hmac(HashAlg::kSha512, key, block_input);
  EXPECT_EQ(Bytes(short_okm->span().begin(), short_okm->span().begin() + 64), t1);
  EXPECT_EQ(HkdfExpandWithKey(HashAlg::kSha512, {}, {}, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HkdfExpandWithKey(HashAlg::kSha512, key, {}, 255 * 64 + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cloister::crypto
