// Test-only helpers for attest/ tests: reading the shared test data and scratch directories.
// Not thread-safe; for tests only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "base/bytes.h"
#include "base/file.h"
#include "gtest/gtest.h"

namespace cloister::attest::testing {

inline std::string TestDataPath(const std::string& relative) {
  return std::string(CLOISTER_TESTDATA_DIR) + "/" + relative;
}

inline std::string ReadTestText(const std::string& relative) {
  auto text = ReadFile(TestDataPath(relative));
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

inline Bytes ReadTestBinary(const std::string& relative) { return ToBytes(ReadTestText(relative)); }

// A file of hex text (one line).
inline Bytes ReadTestHex(const std::string& relative) {
  std::string text = ReadTestText(relative);
  auto bytes = HexDecode(std::string(absl::StripAsciiWhitespace(text)));
  EXPECT_TRUE(bytes.ok()) << relative;
  return bytes.ok() ? *bytes : Bytes();
}

// A fresh directory under the test's temp dir, removed on destruction.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string pattern = ::testing::TempDir() + "/attest_XXXXXX";
    char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cloister::attest::testing
