#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace cloister::testing {
namespace {

// The folders MakeTempDir made in this process, removed with everything in them when the
// process exits, unless CLOISTER_TEST_KEEP_TMP (or CLOISTER_TEST_KEEP_CORE, which keeps a core
// dump written into one) is set to look at them after a run.
class TempDirs {
 public:
  void Add(std::string path) {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(std::move(path));
  }
  ~TempDirs() {
    if (std::getenv("CLOISTER_TEST_KEEP_TMP") != nullptr ||
        std::getenv("CLOISTER_TEST_KEEP_CORE") != nullptr) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& path : paths_) {
      std::error_code error;
      std::filesystem::remove_all(path, error);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::string> paths_;
};

TempDirs& MadeTempDirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  char* made = ::mkdtemp(templ.data());
  if (made == nullptr) return std::string();
  MadeTempDirs().Add(made);
  return made;
}

}  // namespace cloister::testing
