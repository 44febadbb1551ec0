#include "bench/bench_support.h"

#include <filesystem>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "proto/checkpoint_dir.h"
#include "tests/support/temp_dir.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGenerationPrompts[] = {
    "The meaning of life",
    "Once upon a time, in a land far away, there lived",
    "Here is a short list of things to remember:",
    "Q: What is the capital of France?\nA:",
    "It was a dark and stormy night; the rain fell in torrents, except at occasional intervals,",
    "Computers are",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In the beginning",
};

}  // namespace

absl::StatusOr<std::string> MakeScratchDir(const std::string& prefix) {
  std::string dir = testing::MakeTempDir(prefix);
  if (dir.empty()) {
    return absl::InternalError(absl::StrCat("cannot create a folder ", prefix, "-XXXXXX in ",
                                            fs::temp_directory_path().string()));
  }
  return dir;
}

std::string ModelNameOfDir(const std::string& dir) {
  const fs::path path = fs::path(dir).lexically_normal();
  return path.has_filename() ? path.filename().string() : path.parent_path().filename().string();
}

const char* GenerationPrompt(int i) {
  return kGenerationPrompts[static_cast<size_t>(i) % std::size(kGenerationPrompts)];
}

absl::StatusOr<PublishingAppliance> StartPublishingAppliance(const std::string& cloisterd_binary,
                                                             const std::string& work,
                                                             const std::string& model_dir,
                                                             const std::string& name) {
  ASSIGN_OR_RETURN(Bytes package, package::PackCheckpointDir(model_dir, uint64_t{4} << 30));
  const std::string digest = HexEncode(crypto::Sha256(package));
  package = Bytes();
  PublishingAppliance appliance;
  appliance.data_dir = work + "/data";
  const std::string config = work + "/cloisterd.yaml";
  RETURN_IF_ERROR(WriteFileAtomic(
      config,
      absl::StrCat("operator:\n  listen: 127.0.0.1:0\npublished_models:\n  - name: ", name,
                   "\n    file: ", fs::absolute(model_dir).string(), "\n    digest: ", digest,
                   "\n"),
      0600));
  appliance.cloisterd = std::make_unique<testing::Process>(
      std::vector<std::string>{cloisterd_binary, "--listen", "127.0.0.1:0", "--data-dir",
                               appliance.data_dir, "--config", config},
      work);
  const std::string listening =
      appliance.cloisterd->WaitForStdout("cloisterd listening on ", absl::Seconds(120));
  if (listening.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cloisterd did not start: ", appliance.cloisterd->Stderr()));
  }
  appliance.server = listening.substr(listening.rfind(' ') + 1);
  appliance.token_file = absl::StrCat(appliance.data_dir, "/", PublishingAppliance::kTenant, ".token");
  ASSIGN_OR_RETURN(std::string token, ReadFile(appliance.token_file));
  appliance.token = std::string(absl::StripAsciiWhitespace(token));
  appliance.policy_file = appliance.data_dir + "/dev-policy.yaml";
  return appliance;
}

}  // namespace cloister::bench
