#include <sys/resource.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
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

// Minor page faults this process has taken so far.
long MinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates, touches and frees `size` bytes twice; returns the page faults of the second round.
long FaultsOfASecondBuffer(size_t size) {
  auto touch = [size] {
    auto* buffer = static_cast<volatile char*>(std::malloc(size));
    for (size_t i = 0; i < size; i += 4096) buffer[i] = 1;
    std::free(const_cast<char*>(buffer));
  };
  touch();
  const long before = MinorFaults();
  touch();
  return MinorFaults() - before;
}

TEST(MallocTuningTest, FreedRequestSizedBuffersAreReusedWithoutPageFaults) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator ignores mallopt";
#endif
  if (std::getenv("GLIBC_TUNABLES") != nullptr) {
    EXPECT_FALSE(KeepFreedBuffersForReuse()) << "environment settings must win";
    GTEST_SKIP() << "GLIBC_TUNABLES is set for this test";
  }
  constexpr size_t kSize = size_t{8} << 20;  // 2048 pages
  // glibc's default maps a buffer this size afresh (or trims it away) each time.
  const long untuned = FaultsOfASecondBuffer(kSize);
  ASSERT_TRUE(KeepFreedBuffersForReuse());
  FaultsOfASecondBuffer(kSize);  // the first buffer from the heap grows it once
  const long tuned = FaultsOfASecondBuffer(kSize);
  EXPECT_GT(untuned, 1000) << "the untuned allocator already reused the buffer";
  EXPECT_LT(tuned, 100) << "freed buffers went back to the kernel";
}

#if defined(__x86_64__)
// Loads a pattern into zmm31 (the register glibc's AVX-512 memcpy uses last and little else
// touches), runs `between`, and reads zmm31 back.
__attribute__((target("avx512f"), noinline)) std::vector<uint8_t> Zmm31Across(void (*between)()) {
  alignas(64) uint8_t pattern[64];
  for (int i = 0; i < 64; ++i) pattern[i] = static_cast<uint8_t>(0xA5 ^ i);
  alignas(64) uint8_t out[64];
  asm volatile("vmovdqu64 %0, %%zmm31" ::"m"(pattern) : "xmm31");
  between();
  asm volatile("vmovdqu64 %%zmm31, %0" : "=m"(out)::);
  return std::vector<uint8_t>(out, out + 64);
}

__attribute__((noinline)) void Nothing() { asm volatile("" ::: "memory"); }

TEST(SecretBytesTest, ScrubVectorRegistersClearsTheHighAvx512Registers) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "this CPU has no AVX-512";
  // Control: without the scrub, the pattern is still there after a call.
  const std::vector<uint8_t> kept = Zmm31Across(&Nothing);
  EXPECT_EQ(kept[0], 0xA5) << "zmm31 did not keep its value across a call: the test proves nothing";
  const std::vector<uint8_t> scrubbed = Zmm31Across(&ScrubVectorRegisters);
  EXPECT_EQ(scrubbed, std::vector<uint8_t>(64, 0));
}
#endif

}  // namespace
}  // namespace cloister
