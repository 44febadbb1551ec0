// Pieces the appliance benchmarks share: a scratch folder, the name of a checkpoint folder's
// model, the prompts of the generation cases, and a real cloisterd that publishes a checkpoint.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/support/process.h"

namespace cloister::bench {

// A fresh folder "$TMPDIR/PREFIX-XXXXXX", removed with everything in it when the process exits
// (testing::MakeTempDir, with an error where that gives "").
absl::StatusOr<std::string> MakeScratchDir(const std::string& prefix);

// The name a benchmark reports for the checkpoint folder `dir`: its last component, trailing
// slashes or not ("models/tiny-llama/" gives "tiny-llama").
std::string ModelNameOfDir(const std::string& dir);

// Prompts of different lengths for the generation cases; `GenerationPrompt(i)` cycles through them.
const char* GenerationPrompt(int i);

// A real cloisterd on a loopback port with its data in `work`/data, publishing the checkpoint
// folder `model_dir` to every tenant as `name` (its digest computed here, as an operator does).
// Its fresh data dir has the tenant "demo", whose token and the development policy are files
// there. Stop `cloisterd` with SIGTERM for a clean end (destroyed running, it is killed).
struct PublishingAppliance {
  static constexpr char kTenant[] = "demo";
  std::unique_ptr<testing::Process> cloisterd;
  std::string server;       // host:port
  std::string data_dir;
  std::string token_file;   // the demo tenant's
  std::string token;        // its contents, without the newline
  std::string policy_file;  // the development policy a tenant verifies it against
};
absl::StatusOr<PublishingAppliance> StartPublishingAppliance(const std::string& cloisterd_binary,
                                                             const std::string& work,
                                                             const std::string& model_dir,
                                                             const std::string& name);

}  // namespace cloister::bench
