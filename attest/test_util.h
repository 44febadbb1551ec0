// Test-only helpers for attest/ tests: reading the shared test data and scratch directories.
// Not thread-safe; for tests only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "base/bytes.h"
#include "absl/strings/str_cat.h"
#include "attest/verifier.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

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

// A fresh directory (tests/support/temp_dir.h), removed when the test process exits.
class ScopedTempDir {
 public:
  ScopedTempDir() : path_(cloister::testing::MakeTempDir("attest")) {
    EXPECT_FALSE(path_.empty());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Verdict inspection for tests.
// The result of the check `name`; a missing check is a test failure and reads as kFail.
inline Check::Result ResultOf(const Verdict& verdict, const std::string& name) {
  const Check* check = verdict.Find(name);
  EXPECT_NE(check, nullptr) << "no check " << name;
  return check == nullptr ? Check::kFail : check->result;
}

// The detail of the check `name`, or "" when there is none.
inline std::string Detail(const Verdict& verdict, const std::string& name) {
  const Check* check = verdict.Find(name);
  return check == nullptr ? "" : check->detail;
}

// The names of the checks that failed, in order.
inline std::vector<std::string> Failed(const Verdict& verdict) {
  std::vector<std::string> names;
  for (const Check& check : verdict.checks) {
    if (check.result == Check::kFail) names.push_back(check.name);
  }
  return names;
}

// Every check on its own line, for failure messages.
inline std::string Dump(const Verdict& verdict) {
  std::string out;
  for (const Check& check : verdict.checks) {
    absl::StrAppend(&out, check.name, " ", std::string(CheckResultName(check.result)), ": ",
                    check.detail, "\n");
  }
  return out;
}

}  // namespace cloister::attest::testing
