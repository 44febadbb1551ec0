// Loads every file in policies/ with the loader for its folder, so an example that drifts from
// the schema fails the build's tests (STYLE.md rule 11); runs `cloisterd --check-config` on each
// example; and checks that every broken variant in tests/testdata/broken-configs is refused
// with the line and field its first comment names.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "attest/policy.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "host/config/daemon_config.h"
#include "tests/support/process.h"

namespace cloister {
namespace {

namespace fs = std::filesystem;
const std::string kPolicies = CLOISTER_POLICIES_DIR;
const std::string kBroken = CLOISTER_BROKEN_CONFIGS_DIR;

std::vector<fs::path> YamlFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(PoliciesTest, EveryCloisterdConfigLoads) {
  std::vector<fs::path> files = YamlFiles(kPolicies + "/cloisterd");
  for (const fs::path& file : files) {
    // The TLS files the production examples name do not exist here.
    auto config = host::LoadDaemonConfig(file, host::FileChecks::kSkip);
    ASSERT_TRUE(config.ok()) << file << ": " << config.status();
    // Every attestation policy an example refers to loads with the attestation loader, and
    // is for the TEE and GPU the example runs.
    for (const host::AttestationPolicyConfig& reference : config->attestation_policies) {
      auto policy = attest::LoadPolicyFile(reference.file);
      ASSERT_TRUE(policy.ok()) << file << " -> " << reference.file << ": " << policy.status();
    }
  }
  // The four the operations guide promises.
  std::set<std::string> names;
  for (const fs::path& file : files) names.insert(file.filename());
  for (const char* promised :
       {"development.yaml", "sev-snp-h100.yaml", "tdx-h100.yaml", "priorities.yaml"}) {
    EXPECT_TRUE(names.contains(promised)) << promised;
  }
}

TEST(PoliciesTest, ExamplesCoverThreePriorityClassesAndBothTees) {
  auto priorities =
      host::LoadDaemonConfig(kPolicies + "/cloisterd/priorities.yaml", host::FileChecks::kSkip);
  ASSERT_TRUE(priorities.ok()) << priorities.status();
  std::set<host::PriorityClass> classes;
  for (const host::TenantConfig& tenant : priorities->tenants) {
    classes.insert(tenant.limits.priority);
  }
  EXPECT_EQ(classes.size(), 3u);
  auto snp =
      host::LoadDaemonConfig(kPolicies + "/cloisterd/sev-snp-h100.yaml", host::FileChecks::kSkip);
  ASSERT_TRUE(snp.ok()) << snp.status();
  EXPECT_EQ(snp->tee, "sev-snp");
  EXPECT_TRUE(snp->tls.enabled());
  auto tdx =
      host::LoadDaemonConfig(kPolicies + "/cloisterd/tdx-h100.yaml", host::FileChecks::kSkip);
  ASSERT_TRUE(tdx.ok()) << tdx.status();
  EXPECT_EQ(tdx->tee, "tdx");
  EXPECT_TRUE(tdx->tls.require_client_cert);
}

TEST(PoliciesTest, EveryAttestationPolicyLoads) {
  for (const fs::path& file : YamlFiles(kPolicies + "/attestation")) {
    auto policy = attest::LoadPolicyFile(file);
    EXPECT_TRUE(policy.ok()) << file << ": " << policy.status();
  }
}

TEST(PoliciesTest, CheckConfigAcceptsEveryExample) {
  for (const fs::path& file : YamlFiles(kPolicies + "/cloisterd")) {
    testing::RunResult run =
        testing::Run({CLOISTERD_BINARY, "--check-config", file.string(), "--skip-file-checks"});
    EXPECT_EQ(run.exit_code, 0) << file << ": " << run.err;
    EXPECT_TRUE(absl::StrContains(run.out, ": ok (")) << run.out;
  }
  // development.yaml names no files: the full check passes too.
  testing::RunResult full =
      testing::Run({CLOISTERD_BINARY, "--check-config", kPolicies + "/cloisterd/development.yaml"});
  EXPECT_EQ(full.exit_code, 0) << full.err;
  // Without --skip-file-checks a missing certificate is an error that names the field.
  testing::RunResult missing = testing::Run(
      {CLOISTERD_BINARY, "--check-config", kPolicies + "/cloisterd/sev-snp-h100.yaml"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(missing.err, "tls.cert_file")) << missing.err;
}

// The first line of each broken file: "# expect: LINE: FIELD: what"; an optional second line
// "# expect-also: TEXT" for text that follows a path.
TEST(PoliciesTest, BrokenVariantsNameLineAndField) {
  std::vector<fs::path> files = YamlFiles(kBroken);
  EXPECT_GE(files.size(), 10u);
  for (const fs::path& file : files) {
    std::string text = *ReadFile(file, 1 << 20);
    std::vector<std::string> lines = absl::StrSplit(text, '\n');
    ASSERT_TRUE(absl::StartsWith(lines[0], "# expect: ")) << file;
    std::string expected = file.string() + ":" + lines[0].substr(std::string("# expect: ").size());
    std::string also;
    if (absl::StartsWith(lines[1], "# expect-also: ")) {
      also = lines[1].substr(std::string("# expect-also: ").size());
    }
    auto config = host::LoadDaemonConfig(file, host::FileChecks::kRead);
    ASSERT_FALSE(config.ok()) << file << " loaded";
    std::string message(config.status().message());
    EXPECT_TRUE(absl::StrContains(message, expected))
        << "\n  expected: " << expected << "\n  got:      " << message;
    EXPECT_TRUE(absl::StrContains(message, also)) << message;

    // The same through the binary: exit 2, the error on stderr, nothing on stdout.
    testing::RunResult run = testing::Run({CLOISTERD_BINARY, "--check-config", file.string()});
    EXPECT_EQ(run.exit_code, 2) << file;
    EXPECT_TRUE(absl::StrContains(run.err, expected)) << run.err;
    EXPECT_EQ(run.out, "");
  }
}

TEST(PoliciesTest, CheckConfigReportsEveryBrokenSection) {
  std::string dir = testing::MakeTempDir("check_config");
  std::string path = dir + "/many.yaml";
  ASSERT_TRUE(WriteFileAtomic(path,
                              "workers: 0\n"
                              "scheduler:\n  max_batch_size: x\n"
                              "operator:\n  listen: 10.0.0.1:7701\n"
                              "tenants:\n  - id: a\n  - id: b\n    token_sha256: zz\n",
                              0600)
                  .ok());
  testing::RunResult run = testing::Run({CLOISTERD_BINARY, "--check-config", path});
  EXPECT_EQ(run.exit_code, 2);
  for (const char* field :
       {":1: workers:", ":3: scheduler.max_batch_size:", ":5: operator.listen:",
        ":7: tenants[0]: missing field 'token_sha256'", ":9: tenants[1].token_sha256:"}) {
    EXPECT_TRUE(absl::StrContains(run.err, path + field)) << field << "\n" << run.err;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cloister
