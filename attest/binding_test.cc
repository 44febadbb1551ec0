#include "attest/binding.h"

#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

// Expected values computed independently with Python's hashlib from the formulas in
// DESIGN.md section 4 / binding.h.
const Bytes kNonce(32, 0x01);
const Bytes kHpke(32, 0x02);
const Bytes kSigning(32, 0x03);

TEST(BindingTest, ReportDataKnownAnswer) {
  Bytes data = ReportData(kNonce, {ToBytes("abc"), Bytes{}}, kHpke, kSigning);
  EXPECT_EQ(HexEncode(data),
            "2df22217e54843444bb031b2bc5651804299f22cecdc17868397e28553c1194f"
            "4aee8ede2e683f1f0c52d4d0a8c9ab4709f7308dd6dae5ab1e735485eaa6d1f3");
  EXPECT_EQ(data.size(), kReportDataSize);
}

TEST(BindingTest, ReportDataWithoutGpus) {
  EXPECT_EQ(HexEncode(ReportData(kNonce, {}, kHpke, kSigning)),
            "3150a8055d6c2f759826bbbfffcf7ec50b149830f8df5cdbdecbe3f96063df81"
            "89d878051227b6e5add067ca2e24cd2111543d86a919663744d2fb793081eb60");
}

TEST(BindingTest, ReportDataSeparatesEveryInput) {
  Bytes base = ReportData(kNonce, {ToBytes("ab"), ToBytes("c")}, kHpke, kSigning);
  // Moving a byte between reports, reordering, or changing any key or the nonce changes it.
  EXPECT_NE(base, ReportData(kNonce, {ToBytes("a"), ToBytes("bc")}, kHpke, kSigning));
  EXPECT_NE(base, ReportData(kNonce, {ToBytes("c"), ToBytes("ab")}, kHpke, kSigning));
  EXPECT_NE(base, ReportData(kNonce, {ToBytes("abc")}, kHpke, kSigning));
  EXPECT_NE(base, ReportData(kNonce, {ToBytes("ab"), ToBytes("c")}, kSigning, kHpke));
  Bytes other_nonce = kNonce;
  other_nonce[31] ^= 1;
  EXPECT_NE(base, ReportData(other_nonce, {ToBytes("ab"), ToBytes("c")}, kHpke, kSigning));
  EXPECT_EQ(base, ReportData(kNonce, {ToBytes("ab"), ToBytes("c")}, kHpke, kSigning));
}

TEST(BindingTest, GpuRequesterNonceKnownAnswer) {
  Bytes nonce = GpuRequesterNonce(kNonce, kHpke, 1);
  EXPECT_EQ(HexEncode(nonce), "de223df9342c828ea4f971cd5b6e5a3f7d0ecc27181e7ec6b0285a66627dd72e");
  EXPECT_NE(nonce, GpuRequesterNonce(kNonce, kHpke, 0));
  EXPECT_NE(nonce, GpuRequesterNonce(kNonce, kSigning, 1));
}

TEST(BindingTest, EvidenceDigestAndChallengeMessage) {
  EXPECT_EQ(HexEncode(EvidenceDigest("hello")),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  Bytes digest(32, 0xAA);
  Bytes message = ChallengeMessage(digest, kNonce);
  std::string label = "cloister/v1 evidence challenge";
  ASSERT_EQ(message.size(), label.size() + 64);
  EXPECT_EQ(ToString(ByteSpan(message).first(label.size())), label);
  EXPECT_EQ(Bytes(message.begin() + label.size(), message.begin() + label.size() + 32), digest);
  EXPECT_EQ(Bytes(message.end() - 32, message.end()), kNonce);
}

}  // namespace
}  // namespace cloister::attest
