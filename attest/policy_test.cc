#include "attest/policy.h"

#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "attest/sim/sim_tee.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ScopedTempDir;

const std::string kMeasurement(96, 'a');
const std::string kOtherMeasurement = std::string(95, 'b') + "C";

class PolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_TRUE(EnsureSimRoots(dir_->path()).ok());
    auto roots = LoadSimRootCertificates(dir_->path());
    ASSERT_TRUE(roots.ok()) << roots.status();
    cvm_root_ = new std::string(roots->cvm_root.ToPem());
    gpu_root_ = new std::string(roots->gpu_root.ToPem());
    leaf_ = new std::string(roots->gpu_chain[0].ToPem());
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete cvm_root_;
    delete gpu_root_;
    delete leaf_;
  }

  static std::vector<std::string> Indented(const std::string& pem) {
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(pem, '\n', absl::SkipEmpty())) {
      lines.push_back("    " + std::string(line));
    }
    return lines;
  }

  // A valid policy, one YAML line per element; tests edit lines by their (1-based) number.
  static std::vector<std::string> GoodLines() {
    std::vector<std::string> lines = {
        "name: dev",                           // 1
        "tee: sim",                            // 2
        "gpu: sim",                            // 3
        "enclave_measurements:",               // 4
        "  - " + kMeasurement,                 // 5
        "allow_debug: false",                  // 6
        "max_evidence_age_seconds: 3600",      // 7
        "require_fresh_evidence: true",        // 8
        "gpu_versions:",                       // 9
        "  driver_versions: [\"550.90.07\"]",  // 10
        "  vbios_versions: [96.00.9f.00.01]",  // 11
        "sim:",                                // 12
        "  cvm_root_pem: |",                   // 13
    };
    for (const std::string& line : Indented(*cvm_root_)) lines.push_back(line);
    lines.push_back("  gpu_root_pem: |");
    for (const std::string& line : Indented(*gpu_root_)) lines.push_back(line);
    return lines;
  }
  static std::string Join(const std::vector<std::string>& lines) {
    return absl::StrJoin(lines, "\n") + "\n";
  }

  static ScopedTempDir* dir_;
  static std::string* cvm_root_;
  static std::string* gpu_root_;
  static std::string* leaf_;
};
ScopedTempDir* PolicyTest::dir_ = nullptr;
std::string* PolicyTest::cvm_root_ = nullptr;
std::string* PolicyTest::gpu_root_ = nullptr;
std::string* PolicyTest::leaf_ = nullptr;

TEST_F(PolicyTest, ParsesGoodPolicy) {
  auto policy = ParsePolicyYaml(Join(GoodLines()), "good.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->name(), "dev");
  EXPECT_EQ(policy->tee(), v1::TEE_TYPE_SIM);
  EXPECT_EQ(policy->gpu(), v1::GPU_TYPE_SIM);
  ASSERT_EQ(policy->enclave_measurements_size(), 1);
  EXPECT_EQ(policy->enclave_measurements(0), kMeasurement);
  EXPECT_FALSE(policy->allow_debug());
  EXPECT_EQ(policy->max_evidence_age_seconds(), 3600);
  EXPECT_TRUE(policy->require_fresh_evidence());
  EXPECT_EQ(policy->gpu_versions().driver_versions(0), "550.90.07");
  EXPECT_EQ(policy->gpu_versions().vbios_versions(0), "96.00.9F.00.01");  // normalized
  EXPECT_EQ(policy->sim().cvm_root_pem(), *cvm_root_);
  EXPECT_EQ(policy->sim().gpu_root_pem(), *gpu_root_);
}

TEST_F(PolicyTest, MeasurementsAreStoredLowerCase) {
  std::vector<std::string> lines = GoodLines();
  lines[4] = "  - " + kOtherMeasurement;
  auto policy = ParsePolicyYaml(Join(lines), "p.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->enclave_measurements(0), std::string(95, 'b') + "c");
}

TEST_F(PolicyTest, YamlRoundTrip) {
  auto policy = ParsePolicyYaml(Join(GoodLines()), "good.yaml");
  ASSERT_TRUE(policy.ok());
  std::string yaml = PolicyToYaml(*policy);
  auto again = ParsePolicyYaml(yaml, "emitted.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*policy, *again)) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "tee: sim")) << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "cvm_root_pem: |")) << yaml;

  // A policy without optional sections round-trips too.
  Policy minimal;
  minimal.set_name("cpu only");
  minimal.set_tee(v1::TEE_TYPE_SIM);
  minimal.set_gpu(v1::GPU_TYPE_NONE);
  minimal.add_enclave_measurements(kMeasurement);
  minimal.mutable_sim()->set_cvm_root_pem(*cvm_root_);
  auto parsed = ParsePolicyYaml(PolicyToYaml(minimal), "minimal.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << PolicyToYaml(minimal);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(minimal, *parsed));
}

struct BadCase {
  std::string name;
  std::function<void(std::vector<std::string>&)> edit;
  std::string expected;  // a substring of the error
};

TEST_F(PolicyTest, PublishedModelPins) {
  std::vector<std::string> lines = GoodLines();
  lines.push_back("published_models:");
  lines.push_back("  - name: tiny-llama");
  lines.push_back("    digest: " + std::string(64, 'F'));
  auto policy = ParsePolicyYaml(Join(lines), "p.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(policy->published_models_size(), 1);
  EXPECT_EQ(policy->published_models(0).name(), "tiny-llama");
  EXPECT_EQ(policy->published_models(0).digest(), std::string(64, 'f'));  // normalized
  auto again = ParsePolicyYaml(PolicyToYaml(*policy), "emitted.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << PolicyToYaml(*policy);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*policy, *again));

  std::vector<std::string> short_digest = GoodLines();
  short_digest.push_back("published_models: [{name: a, digest: abc}]");
  auto bad = ParsePolicyYaml(Join(short_digest), "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "published_models[0].digest': expected 64 hex digits (a SHA-256), got 'abc'"),
            std::string::npos)
      << bad.status().message();
  std::vector<std::string> twice = GoodLines();
  twice.push_back("published_models: [{name: a, digest: " + std::string(64, '1') +
                  "}, {name: a, digest: " + std::string(64, '2') + "}]");
  bad = ParsePolicyYaml(Join(twice), "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("published_models[1].name': listed twice"),
            std::string::npos)
      << bad.status().message();
}

TEST_F(PolicyTest, ErrorsNameFileLineAndField) {
  const std::string leaf_pem = *leaf_;
  const std::vector<BadCase> cases = {
      {"unknown field", [](auto& l) { l[5] = "alow_debug: true"; },
       "bad.yaml:6: field 'alow_debug': unknown field; expected one of: name, tee, gpu"},
      {"quoted bool", [](auto& l) { l[5] = "allow_debug: \"false\""; },
       "bad.yaml:6: field 'allow_debug': expected true or false, got the string 'false'"},
      {"number as bool", [](auto& l) { l[5] = "allow_debug: 1"; },
       "bad.yaml:6: field 'allow_debug': expected true or false, got '1'"},
      {"text as number", [](auto& l) { l[6] = "max_evidence_age_seconds: soon"; },
       "bad.yaml:7: field 'max_evidence_age_seconds': expected a whole number, got 'soon'"},
      {"quoted number", [](auto& l) { l[6] = "max_evidence_age_seconds: \"3600\""; },
       "bad.yaml:7: field 'max_evidence_age_seconds': expected a whole number"},
      {"list as number", [](auto& l) { l[6] = "max_evidence_age_seconds: [1]"; },
       "bad.yaml:7: field 'max_evidence_age_seconds': expected a whole number, got a list"},
      {"negative age", [](auto& l) { l[6] = "max_evidence_age_seconds: -5"; },
       "bad.yaml:7: field 'max_evidence_age_seconds': must not be negative"},
      {"bad hex", [](auto& l) { l[4] = "  - " + std::string(95, 'a') + "z"; },
       "bad.yaml:5: field 'enclave_measurements[0]': expected 96 hex digits"},
      {"short hex", [](auto& l) { l[4] = "  - abcd"; },
       "bad.yaml:5: field 'enclave_measurements[0]': expected 96 hex digits"},
      {"duplicate measurement",
       [](auto& l) { l.insert(l.begin() + 5, "  - " + std::string(96, 'A')); },
       "bad.yaml:6: field 'enclave_measurements[1]': listed twice"},
      {"scalar for list",
       [](auto& l) {
         l[3] = "enclave_measurements: " + kMeasurement;
         l.erase(l.begin() + 4);
       },
       "bad.yaml:4: field 'enclave_measurements': expected a list"},
      {"no measurements",
       [](auto& l) {
         l[3] = "enclave_measurements: []";
         l.erase(l.begin() + 4);
       },
       "bad.yaml:4: field 'enclave_measurements': missing"},
      {"missing name", [](auto& l) { l.erase(l.begin()); }, "bad.yaml:1: field 'name': missing"},
      {"null name", [](auto& l) { l[0] = "name:"; },
       "bad.yaml:1: field 'name': expected text, got nothing (null)"},
      {"missing tee", [](auto& l) { l.erase(l.begin() + 1); }, "field 'tee': missing"},
      {"unknown tee", [](auto& l) { l[1] = "tee: sgx"; },
       "bad.yaml:2: field 'tee': expected one of sim, sev-snp, tdx; got 'sgx'"},
      {"unknown gpu", [](auto& l) { l[2] = "gpu: h100"; },
       "bad.yaml:3: field 'gpu': expected one of none, sim, nvidia-cc; got 'h100'"},
      {"sim gpu under real tee", [](auto& l) { l[1] = "tee: sev-snp"; },
       "bad.yaml:3: field 'gpu': a simulated GPU is only accepted together with tee: sim"},
      {"nested unknown field", [](auto& l) { l.insert(l.begin() + 12, "  extra: 1"); },
       "bad.yaml:13: field 'sim.extra': unknown field; expected one of: cvm_root_pem, "
       "gpu_root_pem"},
      {"scalar for mapping",
       [](auto& l) {
         l.resize(11);
         l.push_back("sim: none");
       },
       "bad.yaml:12: field 'sim': expected a mapping, got 'none'"},
      {"missing roots", [](auto& l) { l.resize(11); }, "field 'sim.cvm_root_pem': missing"},
      {"not a PEM",
       [](auto& l) {
         l.resize(13);
         l[12] = "  cvm_root_pem: hello";
       },
       "bad.yaml:13: field 'sim.cvm_root_pem': PEM chain"},
      {"bad VBIOS", [](auto& l) { l[10] = "  vbios_versions: [96.00]"; },
       "bad.yaml:11: field 'gpu_versions.vbios_versions[0]': '96.00' is not a VBIOS version"},
      {"bad driver", [](auto& l) { l[9] = "  driver_versions: [latest]"; },
       "bad.yaml:10: field 'gpu_versions.driver_versions[0]': 'latest' is not a driver version"},
      {"duplicate key", [](auto& l) { l.push_back("name: again"); },
       "field 'name': appears twice (first on line 1)"},
      {"versions without GPU", [](auto& l) { l[2] = "gpu: none"; },
       "bad.yaml:9: field 'gpu_versions': GPU versions are only allowed when a GPU is expected"},
  };
  for (const BadCase& c : cases) {
    std::vector<std::string> lines = GoodLines();
    c.edit(lines);
    auto policy = ParsePolicyYaml(Join(lines), "bad.yaml");
    ASSERT_FALSE(policy.ok()) << c.name;
    EXPECT_TRUE(absl::IsInvalidArgument(policy.status())) << c.name;
    EXPECT_TRUE(absl::StrContains(policy.status().message(), c.expected))
        << c.name << "\n  got: " << policy.status().message() << "\n  want: " << c.expected;
  }
}

TEST_F(PolicyTest, RootMustBeACa) {
  std::vector<std::string> lines = GoodLines();
  lines.resize(13);
  for (const std::string& line : Indented(*leaf_)) lines.push_back(line);
  lines.push_back("  gpu_root_pem: |");
  for (const std::string& line : Indented(*gpu_root_)) lines.push_back(line);
  auto policy = ParsePolicyYaml(Join(lines), "bad.yaml");
  ASSERT_FALSE(policy.ok());
  EXPECT_TRUE(
      absl::StrContains(policy.status().message(),
                        "bad.yaml:13: field 'sim.cvm_root_pem': the certificate is not a CA"))
      << policy.status();
}

TEST_F(PolicyTest, DocumentLevelErrors) {
  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"name: [unclosed\n", "bad.yaml:"},
      {"- a\n- b\n", "bad.yaml:1: the policy must be a mapping of fields, not a list"},
      {"", "expected exactly one YAML document, found 0"},
      {"name: a\n---\nname: b\n", "expected exactly one YAML document, found 2"},
      {"just text\n", "the policy must be a mapping"},
  };
  for (const Case& c : cases) {
    auto policy = ParsePolicyYaml(c.text, "bad.yaml");
    ASSERT_FALSE(policy.ok()) << c.text;
    EXPECT_TRUE(absl::StrContains(policy.status().message(), c.expected))
        << c.text << " -> " << policy.status();
  }
}

TEST_F(PolicyTest, LoadPolicyFileNamesThePath) {
  ScopedTempDir dir;
  std::string path = dir.path() + "/tenant.yaml";
  std::vector<std::string> lines = GoodLines();
  lines[5] = "alow_debug: true";
  ASSERT_TRUE(WriteFileAtomic(path, Join(lines), 0644).ok());
  auto policy = LoadPolicyFile(path);
  ASSERT_FALSE(policy.ok());
  EXPECT_TRUE(absl::StrContains(policy.status().message(), path + ":6: field 'alow_debug'"))
      << policy.status();
  EXPECT_TRUE(absl::IsNotFound(LoadPolicyFile(dir.path() + "/missing.yaml").status()));
}

TEST_F(PolicyTest, NvidiaSection) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/prod.yaml";
  const std::string good =
      "name: prod\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [" + kMeasurement +
      "]\ngpu_versions:\n  driver_versions: [\"550.90.07\"]\nnvidia:\n  rim_dir: rims\n"
      "  ocsp_dir: /var/lib/ocsp\n  require_ocsp: true\n";
  ASSERT_TRUE(WriteFileAtomic(path, good, 0644).ok());
  auto policy = LoadPolicyFile(path);
  ASSERT_TRUE(policy.ok()) << policy.status();
  // A relative RIM directory is relative to the policy file; an absolute one stays.
  EXPECT_EQ(policy->nvidia().rim_dir(),
            (std::filesystem::path(dir.path()) / "rims").lexically_normal().string());
  EXPECT_EQ(policy->nvidia().ocsp_dir(), "/var/lib/ocsp");
  EXPECT_TRUE(policy->nvidia().require_ocsp());
  // Parsing the text alone leaves the path as written.
  auto parsed = ParsePolicyYaml(good, "prod.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->nvidia().rim_dir(), "rims");

  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"name: p\ntee: sev-snp\ngpu: none\nenclave_measurements: [" + kMeasurement +
           "]\nnvidia:\n  rim_dir: rims\n",
       "p.yaml:5: field 'nvidia': NVIDIA settings are only allowed when gpu is nvidia-cc"},
      {"name: p\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [" + kMeasurement +
           "]\nnvidia:\n  device_root_pem: nonsense\n",
       "p.yaml:6: field 'nvidia.device_root_pem': "},
      {"name: p\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [" + kMeasurement +
           "]\nnvidia:\n  rim_dirs: rims\n",
       "p.yaml:6: field 'nvidia.rim_dirs': unknown field; expected one of: device_root_pem, "
       "corim_root_pem, rim_dir, ocsp_dir, require_ocsp, allow_ocsp_cert_hold, "
       "allow_expired_rim"},
  };
  for (const Case& c : cases) {
    auto bad = ParsePolicyYaml(c.text, "p.yaml");
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_TRUE(absl::StrContains(bad.status().message(), c.expected))
        << c.text << " -> " << bad.status();
  }
  // A leaf certificate is not a root.
  std::string leaf_root = "name: p\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [" +
                          kMeasurement + "]\nnvidia:\n  corim_root_pem: |\n";
  for (const std::string& line : Indented(*leaf_)) leaf_root += line + "\n";
  auto bad = ParsePolicyYaml(leaf_root, "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(),
                                "field 'nvidia.corim_root_pem': the certificate is not a CA"))
      << bad.status();
}

TEST_F(PolicyTest, DevPolicy) {
  ScopedTempDir out;
  Bytes measurement(48, 0x5C);
  std::string path = out.path() + "/dev-policy.yaml";
  ASSERT_TRUE(WriteDevPolicy(path, dir_->path(), measurement).ok());
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(absl::StartsWith(*text, "# Cloister development attestation policy.")) << *text;
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  auto loaded = LoadPolicyFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto made = MakeDevPolicy(dir_->path(), measurement);
  ASSERT_TRUE(made.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*loaded, *made));
  EXPECT_EQ(loaded->enclave_measurements(0), HexEncode(measurement));
  EXPECT_EQ(loaded->sim().cvm_root_pem(), *cvm_root_);
  EXPECT_EQ(loaded->sim().gpu_root_pem(), *gpu_root_);
  EXPECT_FALSE(loaded->allow_debug());
  EXPECT_EQ(loaded->max_evidence_age_seconds(), kDevPolicyMaxEvidenceAgeSeconds);

  EXPECT_FALSE(WriteDevPolicy(path, dir_->path(), Bytes(47, 0)).ok());
  EXPECT_FALSE(WriteDevPolicy(path, out.path() + "/no-sim", measurement).ok());
}

}  // namespace
}  // namespace cloister::attest
