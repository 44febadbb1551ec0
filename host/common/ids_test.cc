#include "host/common/ids.h"

#include <string>

#include "gtest/gtest.h"

namespace cloister::host {
namespace {

TEST(IdsTest, TenantIds) {
  EXPECT_TRUE(IsValidTenantId("demo"));
  EXPECT_TRUE(IsValidTenantId("Acme-Corp_2.eu"));
  EXPECT_TRUE(IsValidTenantId(std::string(64, 'a')));
  EXPECT_FALSE(IsValidTenantId(""));
  EXPECT_FALSE(IsValidTenantId(std::string(65, 'a')));
  EXPECT_FALSE(IsValidTenantId(".."));
  EXPECT_FALSE(IsValidTenantId(".hidden"));
  EXPECT_FALSE(IsValidTenantId("-flag"));
  EXPECT_FALSE(IsValidTenantId("a/b"));
  EXPECT_FALSE(IsValidTenantId("a b"));
  EXPECT_EQ(CheckTenantId("a/b").code(), absl::StatusCode::kInvalidArgument);
}

TEST(IdsTest, ModelHandles) {
  EXPECT_TRUE(IsValidModelHandle("0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(IsValidModelHandle("0123456789ABCDEF0123456789abcdef"));   // uppercase
  EXPECT_FALSE(IsValidModelHandle("0123456789abcdef0123456789abcde"));    // 31
  EXPECT_FALSE(IsValidModelHandle("0123456789abcdef0123456789abcdef0"));  // 33
  EXPECT_FALSE(IsValidModelHandle("0123456789abcdef0123456789abcdeg"));
  EXPECT_FALSE(IsValidModelHandle(""));
  EXPECT_EQ(CheckModelHandle("../x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(IdsTest, RequestIds) {
  EXPECT_TRUE(CheckRequestId("r-1").ok());
  EXPECT_TRUE(CheckRequestId(std::string(128, 'x')).ok());
  EXPECT_EQ(CheckRequestId("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRequestId(std::string(129, 'x')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRequestId("a b").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRequestId("a\nb").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRequestId("caf\xc3\xa9").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cloister::host
