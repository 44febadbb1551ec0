// Loads every file in policies/ with the loader for its folder, so an example that drifts from
// the schema fails the build's tests (STYLE.md rule 11).
#include <filesystem>
#include <string>

#include "attest/policy.h"
#include "gtest/gtest.h"
#include "host/config/daemon_config.h"

namespace cloister {
namespace {

namespace fs = std::filesystem;
const std::string kPolicies = CLOISTER_POLICIES_DIR;

TEST(PoliciesTest, EveryCloisterdConfigLoads) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kPolicies + "/cloisterd")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    auto config = host::LoadDaemonConfig(entry.path());
    EXPECT_TRUE(config.ok()) << entry.path() << ": " << config.status();
  }
  EXPECT_GE(files, 2);
}

TEST(PoliciesTest, EveryAttestationPolicyLoads) {
  if (!fs::exists(kPolicies + "/attestation")) GTEST_SKIP() << "no attestation policies yet";
  for (const auto& entry : fs::directory_iterator(kPolicies + "/attestation")) {
    if (entry.path().extension() != ".yaml") continue;
    auto policy = attest::LoadPolicyFile(entry.path());
    EXPECT_TRUE(policy.ok()) << entry.path() << ": " << policy.status();
  }
}

TEST(PoliciesTest, BrokenConfigNamesTheField) {
  auto config = host::ParseDaemonConfig("listen: \"127.0.0.1:1\"\nbatching:\n  max_batch_sise: 4\n", "broken.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(std::string(config.status().message()).find("broken.yaml:3"), std::string::npos)
      << config.status();
}

}  // namespace
}  // namespace cloister
