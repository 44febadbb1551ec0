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

TEST(LogTest, LinesHaveTheFixedFieldsOnceAndInOrder) {
  std::vector<std::string> lines;
  SetLogSinkForTest([&](const std::string& line) { lines.push_back(line); });
  Log(LogLevel::kWarning, "shadow_attempt", {{"event", "forged"}, {"level", "debug"}});
  SetLogSinkForTest(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_EQ(line.rfind("{\"ts\":\"", 0), 0u) << line;
  EXPECT_NE(line.find("\"level\":\"warning\",\"component\":"), std::string::npos) << line;
  EXPECT_NE(line.find("\"event\":\"shadow_attempt\""), std::string::npos) << line;
  EXPECT_EQ(line.find("\"event\":\"forged\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"field_event\":\"forged\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"field_level\":\"debug\""), std::string::npos) << line;
  EXPECT_EQ(line.back(), '\n');
}

}  // namespace
}  // namespace cloister
