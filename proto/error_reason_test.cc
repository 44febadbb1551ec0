#include "proto/error_reason.h"

#include "gtest/gtest.h"

namespace cloister::proto {
namespace {

using api::v1::ERROR_REASON_UNSPECIFIED;
using api::v1::SESSION_LOST;

TEST(ErrorReasonTest, TravelsOnTheStatusAndLeavesCodeAndMessageAlone) {
  absl::Status lost = WithReason(absl::FailedPreconditionError("re-attest"), SESSION_LOST);
  EXPECT_EQ(ReasonOf(lost), SESSION_LOST);
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lost.message(), "re-attest");
  EXPECT_EQ(ReasonOf(absl::FailedPreconditionError("re-attest")), ERROR_REASON_UNSPECIFIED);
  // A later reason replaces an earlier one; OK never carries one.
  EXPECT_EQ(ReasonOf(WithReason(lost, api::v1::OVERLOADED)), api::v1::OVERLOADED);
  EXPECT_TRUE(WithReason(absl::OkStatus(), SESSION_LOST).ok());
  EXPECT_EQ(ReasonOf(WithReason(absl::OkStatus(), SESSION_LOST)), ERROR_REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonName(SESSION_LOST), "SESSION_LOST");
  EXPECT_EQ(ReasonName(ERROR_REASON_UNSPECIFIED), "");
  EXPECT_EQ(ReasonName(static_cast<api::v1::ErrorReason>(999)), "");
}

TEST(ErrorReasonTest, CrossesTheBoundaryStatus) {
  boundary::v1::Status wire;
  SetBoundaryStatus(WithReason(absl::ResourceExhaustedError("queue full"), api::v1::OVERLOADED),
                    wire);
  EXPECT_EQ(wire.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(wire.reason(), api::v1::OVERLOADED);
  absl::Status back = FromBoundaryStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(back.message(), "queue full");
  EXPECT_EQ(ReasonOf(back), api::v1::OVERLOADED);

  SetBoundaryStatus(absl::OkStatus(), wire);
  EXPECT_EQ(wire.code(), 0);
  EXPECT_EQ(wire.reason(), ERROR_REASON_UNSPECIFIED);
  EXPECT_TRUE(FromBoundaryStatus(wire).ok());

  // What a host sends is not trusted to be in range.
  wire.set_code(99);
  wire.set_message("odd");
  EXPECT_EQ(FromBoundaryStatus(wire).message(), "enclave error with unknown code 99: odd");
  wire.set_code(9);
  wire.set_reason(static_cast<api::v1::ErrorReason>(12345));
  EXPECT_EQ(ReasonOf(FromBoundaryStatus(wire)), ERROR_REASON_UNSPECIFIED);
}

TEST(ErrorReasonTest, CrossesGrpcAsAnErrorInfo) {
  absl::Status stored =
      WithReason(absl::UnavailableError("nothing was stored"), api::v1::NOTHING_STORED);
  std::string details = GrpcErrorDetails(stored);
  ASSERT_FALSE(details.empty());
  EXPECT_EQ(ReasonFromGrpcDetails(details), api::v1::NOTHING_STORED);

  // Readable as a google.rpc.Status with one ErrorInfo by any client.
  api::v1::ErrorStatus parsed;
  ASSERT_TRUE(parsed.ParseFromString(details));
  EXPECT_EQ(parsed.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(parsed.message(), "nothing was stored");
  ASSERT_EQ(parsed.details_size(), 1);
  api::v1::ErrorInfo info;
  ASSERT_TRUE(info.ParseFromString(parsed.details(0).value()));
  EXPECT_EQ(info.reason(), "NOTHING_STORED");
  EXPECT_EQ(info.domain(), "cloister");

  EXPECT_EQ(GrpcErrorDetails(absl::UnavailableError("no reason")), "");
  EXPECT_EQ(ReasonFromGrpcDetails(""), ERROR_REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonFromGrpcDetails("\xff\xff not a message"), ERROR_REASON_UNSPECIFIED);
  info.set_domain("elsewhere");
  parsed.mutable_details(0)->set_value(info.SerializeAsString());
  EXPECT_EQ(ReasonFromGrpcDetails(parsed.SerializeAsString()), ERROR_REASON_UNSPECIFIED);
  info.set_domain("cloister");
  info.set_reason("NOT_A_REASON");
  parsed.mutable_details(0)->set_value(info.SerializeAsString());
  EXPECT_EQ(ReasonFromGrpcDetails(parsed.SerializeAsString()), ERROR_REASON_UNSPECIFIED);
}

}  // namespace
}  // namespace cloister::proto
