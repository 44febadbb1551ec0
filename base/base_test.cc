#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/log.h"
#include "base/secret_bytes.h"
#include "gtest/gtest.h"

namespace cloister {
namespace {

TEST(BytesTest, HexRoundTrip) {
  Bytes b = {0x00, 0x7f, 0xff, 0x10};
  EXPECT_EQ(HexEncode(b), "007fff10");
  auto decoded = HexDecode("007FFF10");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, b);
}

TEST(BytesTest, HexRejectsBadInput) {
  EXPECT_FALSE(HexDecode("abc").ok());
  EXPECT_FALSE(HexDecode("zz").ok());
}

TEST(BytesTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals(AsBytes("abc"), AsBytes("abc")));
  EXPECT_FALSE(ConstantTimeEquals(AsBytes("abc"), AsBytes("abd")));
  EXPECT_FALSE(ConstantTimeEquals(AsBytes("abc"), AsBytes("ab")));
}

TEST(SecretBytesTest, MoveLeavesSourceEmpty) {
  SecretBytes a(AsBytes("secret"));
  SecretBytes b = std::move(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(ToString(b.span()), "secret");
}

TEST(LogTest, SecretFieldsAreRedacted) {
  std::vector<std::string> lines;
  SetLogSinkForTest([&](const std::string& line) { lines.push_back(line); });
  Log(LogLevel::kInfo, "test_event", {{"tenant", "demo"}, Secret("token"), {"count", 3}});
  SetLogSinkForTest(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("\"tenant\":\"demo\""), std::string::npos);
  EXPECT_NE(lines[0].find("\"token\":\"[redacted]\""), std::string::npos);
  EXPECT_NE(lines[0].find("\"count\":3"), std::string::npos);
}

}  // namespace
}  // namespace cloister
