#include "attest/nvidia/ocsp.h"

#include "attest/nvidia/test_pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::IssueTestCert;
using ::cloister::attest::testing::MakeTestOcspResponse;
using ::cloister::attest::testing::MakeTestRoot;
using ::cloister::attest::testing::ParseTestTime;
using ::cloister::attest::testing::TestIdentity;
using ::cloister::attest::testing::TestOcspStatus;
using ::testing::HasSubstr;

// root -> ca -> leaf; the CA answers OCSP for the leaf itself.
class OcspTest : public ::testing::Test {
 protected:
  OcspTest()
      : root_(MakeTestRoot("Test Root")),
        ca_(IssueTestCert(root_, "Test ICA", true)),
        leaf_(IssueTestCert(ca_, "Test Leaf", false)),
        at_(ParseTestTime("2024-06-01T00:00:00Z")) {}

  Bytes Response(TestOcspStatus status, const TestIdentity& responder,
                 absl::Duration age = absl::Hours(1),
                 std::optional<absl::Duration> valid_for = absl::Hours(24)) {
    std::optional<absl::Time> next;
    if (valid_for.has_value()) next = at_ - age + *valid_for;
    return MakeTestOcspResponse(leaf_.cert, ca_.cert, responder, status, at_ - age, next);
  }
  absl::StatusOr<OcspCertStatus> Check(const std::vector<Bytes>& responses) {
    return CheckOcspResponse(responses, leaf_.cert, ca_.cert, root_.cert, {ca_.cert}, at_);
  }

  TestIdentity root_, ca_, leaf_;
  absl::Time at_;
};

TEST_F(OcspTest, Good) {
  auto status = Check({Response(TestOcspStatus::kGood, ca_)});
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->status, OcspStatus::kGood);
  EXPECT_EQ(status->subject, "Test Leaf");
  EXPECT_EQ(status->this_update, at_ - absl::Hours(1));
  EXPECT_EQ(status->next_update, at_ + absl::Hours(23));
  EXPECT_EQ(OcspStatusName(status->status), "good");
}

TEST_F(OcspTest, RevokedAndHoldAndUnknownAreReportedNotHidden) {
  auto revoked = Check({Response(TestOcspStatus::kRevoked, ca_)});
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  EXPECT_EQ(revoked->status, OcspStatus::kRevoked);
  EXPECT_EQ(revoked->revocation_reason, "keyCompromise");
  auto hold = Check({Response(TestOcspStatus::kHold, ca_)});
  ASSERT_TRUE(hold.ok());
  EXPECT_EQ(hold->revocation_reason, "certificateHold");
  auto unknown = Check({Response(TestOcspStatus::kUnknown, ca_)});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, OcspStatus::kUnknown);
}

TEST_F(OcspTest, FindsTheRightResponseAmongSeveral) {
  TestIdentity other = IssueTestCert(ca_, "Other Leaf", false);
  Bytes about_other = MakeTestOcspResponse(other.cert, ca_.cert, ca_, TestOcspStatus::kRevoked,
                                           at_ - absl::Hours(1), at_ + absl::Hours(1));
  auto status = Check({about_other, Response(TestOcspStatus::kGood, ca_)});
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->status, OcspStatus::kGood);
  auto missing = Check({about_other});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no saved OCSP response covers 'Test Leaf'"));
}

TEST_F(OcspTest, ResponderMustBeAuthorized) {
  // Signed by a sibling that the issuer never delegated OCSP to.
  TestIdentity sibling = IssueTestCert(ca_, "Not a responder", false);
  auto status = Check({Response(TestOcspStatus::kGood, sibling)});
  EXPECT_EQ(status.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(OcspTest, ResponderMustChainToThePinnedRoot) {
  TestIdentity stranger = MakeTestRoot("Test Root");
  TestIdentity fake_ca = IssueTestCert(stranger, "Test ICA", true);
  // A response about our leaf's CertID is impossible to forge without the CA's key; one
  // signed by a look-alike CA under another root is refused.
  Bytes forged = MakeTestOcspResponse(leaf_.cert, ca_.cert, fake_ca, TestOcspStatus::kGood,
                                      at_ - absl::Hours(1), at_ + absl::Hours(1));
  auto status = Check({forged});
  EXPECT_EQ(status.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.status().message(), HasSubstr("does not verify to the pinned 'Test Root'"));
}

TEST_F(OcspTest, StaleAndFutureResponsesAreRefused) {
  auto stale = Check({Response(TestOcspStatus::kGood, ca_, absl::Hours(48), absl::Hours(24))});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(stale.status().message(), HasSubstr("stale"));
  auto future = Check({Response(TestOcspStatus::kGood, ca_, -absl::Hours(2), absl::Hours(24))});
  EXPECT_EQ(future.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(future.status().message(), HasSubstr("after the verification time"));
  // Without nextUpdate a response stays usable.
  auto open = Check({Response(TestOcspStatus::kGood, ca_, absl::Hours(48), std::nullopt)});
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(open->next_update, absl::InfiniteFuture());
}

TEST_F(OcspTest, MalformedResponseIsInvalid) {
  EXPECT_EQ(Check({Bytes{0x30, 0x03, 0x0A, 0x01, 0x00}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  Bytes good = Response(TestOcspStatus::kGood, ca_);
  good.push_back(0);  // trailing byte
  EXPECT_EQ(Check({good}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check({}).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cloister::attest
