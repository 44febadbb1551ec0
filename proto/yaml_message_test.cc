#include "proto/yaml_message.h"

#include <string>

#include "cloister/attest/v1/policy.pb.h"
#include "cloister/config/v1/daemon.pb.h"
#include "gtest/gtest.h"

namespace cloister::proto {
namespace {

namespace v1 = ::cloister::config::v1;

// The options cloisterd's config uses, in small.
YamlReadOptions ConfigOptions() {
  YamlReadOptions options;
  options.wording = YamlWording::kConfig;
  options.byte_suffixes = true;
  options.inline_fields = {"cloister.config.v1.Tenant.limits"};
  options.aliases = {{"cloister.config.v1.Daemon.batching", "scheduler"}};
  options.ranges = {{"cloister.config.v1.Daemon.workers", {1, 64}},
                    {"cloister.config.v1.TenantLimits.rate_per_second", {0, 1e9}}};
  return options;
}

// The error of reading `text` into a message of type M, or "" when it reads.
template <typename M>
std::string ErrorOf(const std::string& text, YamlReadOptions options = {}) {
  YamlMessageReader reader("t.yaml", std::move(options));
  M message;
  absl::Status status = reader.ReadMessage(YAML::Load(text), message);
  return std::string(status.message());
}

TEST(YamlMessageTest, EnumNamesDropThePrefix) {
  EXPECT_EQ(EnumYamlName(*attest::v1::TeeType_descriptor()->FindValueByName("TEE_TYPE_SEV_SNP")),
            "sev-snp");
  EXPECT_EQ(EnumYamlName(*v1::PcieMode_descriptor()->FindValueByName("PCIE_MODE_EMULATED")),
            "emulated");
}

TEST(YamlMessageTest, ReadsNestedRepeatedAndEnumFields) {
  YamlMessageReader reader("t.yaml");
  attest::v1::Policy policy;
  ASSERT_TRUE(reader
                  .ReadMessage(YAML::Load("name: p\ntee: sev-snp\nallow_debug: True\n"
                                          "max_evidence_age_seconds: 60\n"
                                          "enclave_measurements: [aa, bb]\n"
                                          "gpu_versions:\n  driver_versions: [\"550.90.07\"]\n"),
                               policy)
                  .ok());
  EXPECT_EQ(policy.name(), "p");
  EXPECT_EQ(policy.tee(), attest::v1::TEE_TYPE_SEV_SNP);
  EXPECT_TRUE(policy.allow_debug());
  EXPECT_EQ(policy.max_evidence_age_seconds(), 60);
  ASSERT_EQ(policy.enclave_measurements_size(), 2);
  EXPECT_EQ(policy.enclave_measurements(1), "bb");
  EXPECT_EQ(policy.gpu_versions().driver_versions(0), "550.90.07");
  // Where each field was written, for checks after the read.
  EXPECT_EQ(reader.Error("gpu_versions.driver_versions[0]", "bad").message(),
            "t.yaml:7: field 'gpu_versions.driver_versions[0]': bad");
  EXPECT_EQ(reader.KeyMark("gpu_versions").line, 5);
  EXPECT_EQ(reader.KeyMark("gpu_versions.vbios_versions").line, 5);  // not written: its map
  EXPECT_EQ(reader.KeyMark("nowhere").line, 0);                      // the document
  EXPECT_EQ(ErrorLine(reader.Error("tee", "x")), 2);
  EXPECT_EQ(ErrorLine(absl::InvalidArgumentError("x")), 0);
}

TEST(YamlMessageTest, PolicyWording) {
  using attest::v1::Policy;
  EXPECT_EQ(ErrorOf<Policy>("name: a\nalow_debug: true\n").substr(0, 66),
            "t.yaml:2: field 'alow_debug': unknown field; expected one of: name");
  EXPECT_EQ(ErrorOf<Policy>("name: a\nname: b\n"),
            "t.yaml:2: field 'name': appears twice (first on line 1)");
  EXPECT_EQ(ErrorOf<Policy>("allow_debug: \"true\"\n"),
            "t.yaml:1: field 'allow_debug': expected true or false, got the string 'true'");
  EXPECT_EQ(ErrorOf<Policy>("max_evidence_age_seconds: soon\n"),
            "t.yaml:1: field 'max_evidence_age_seconds': expected a whole number, got 'soon'");
  EXPECT_EQ(ErrorOf<Policy>("name:\n"),
            "t.yaml:1: field 'name': expected text, got nothing (null)");
  EXPECT_EQ(ErrorOf<Policy>("tee: sgx\n"),
            "t.yaml:1: field 'tee': expected one of sim, sev-snp, tdx; got 'sgx'");
  EXPECT_EQ(ErrorOf<Policy>("sim: none\n"),
            "t.yaml:1: field 'sim': expected a mapping, got 'none'");
  EXPECT_EQ(ErrorOf<Policy>("enclave_measurements: aa\n"),
            "t.yaml:1: field 'enclave_measurements': expected a list, got 'aa'");
  EXPECT_EQ(ErrorOf<Policy>("[a]: 1\n"), "t.yaml:1: field names must be plain words");
  EXPECT_EQ(ErrorOf<Policy>("name: \"\"\n"), "");  // empty text is text
}

TEST(YamlMessageTest, ConfigWording) {
  using v1::Daemon;
  EXPECT_EQ(ErrorOf<Daemon>("port: 7\n", ConfigOptions()), "t.yaml:1: unknown field 'port'");
  EXPECT_EQ(ErrorOf<Daemon>("tls:\n  cert: a\n", ConfigOptions()),
            "t.yaml:2: tls: unknown field 'cert'");
  EXPECT_EQ(ErrorOf<Daemon>("listen: [a]\n", ConfigOptions()),
            "t.yaml:1: listen: expected a string, got a list");
  EXPECT_EQ(ErrorOf<Daemon>("listen: \"\"\n", ConfigOptions()),
            "t.yaml:1: listen: must not be empty");
  EXPECT_EQ(ErrorOf<Daemon>("tls: 5\n", ConfigOptions()),
            "t.yaml:1: tls: expected a map, got a scalar");
  EXPECT_EQ(ErrorOf<Daemon>("tenants:\n  a: 1\n", ConfigOptions()),
            "t.yaml:2: tenants: expected a list, got a map");  // at the value, not the key
  EXPECT_EQ(ErrorOf<Daemon>("workers: two\n", ConfigOptions()),
            "t.yaml:1: workers: expected an integer, got 'two'");
  EXPECT_EQ(ErrorOf<Daemon>("workers: \"3\"\n", ConfigOptions()), "");  // quoted numbers are fine
  EXPECT_EQ(ErrorOf<Daemon>("workers: 65\n", ConfigOptions()),
            "t.yaml:1: workers: 65 is outside 1..64");
  EXPECT_EQ(ErrorOf<Daemon>("workers: -1\n", ConfigOptions()),
            "t.yaml:1: workers: -1 is outside 1..64");
  EXPECT_EQ(ErrorOf<Daemon>("tls:\n  require_client_cert: TRUE\n", ConfigOptions()),
            "t.yaml:2: tls.require_client_cert: expected true or false, got 'TRUE'");
  EXPECT_EQ(ErrorOf<Daemon>("tee: sgx\n", ConfigOptions()),
            "t.yaml:1: tee: tee must be sim, sev-snp or tdx, not 'sgx'");
  EXPECT_EQ(ErrorOf<Daemon>("tenants:\n  - id: a\n    rate_per_second: -1\n", ConfigOptions()),
            "t.yaml:3: tenants[0].rate_per_second: -1 is outside 0..1e+09");
  EXPECT_EQ(ErrorOf<Daemon>("tenants:\n  - id: a\n    rate_per_second: fast\n", ConfigOptions()),
            "t.yaml:3: tenants[0].rate_per_second: expected a number, got 'fast'");
  EXPECT_EQ(ErrorOf<Daemon>("limits:\n  max_model_bytes: 16MB\n", ConfigOptions()),
            "t.yaml:2: limits.max_model_bytes: expected a size in bytes (like 1048576 or 64MiB), "
            "got '16MB'");
  EXPECT_EQ(ErrorOf<Daemon>("limits:\n  max_model_bytes: 2000TiB\n", ConfigOptions()),
            "t.yaml:2: limits.max_model_bytes: expected a size in bytes (like 1048576 or 64MiB), "
            "got '2000TiB'");
  // The inline message's own name is not a key.
  EXPECT_EQ(ErrorOf<Daemon>("tenants:\n  - limits: {}\n", ConfigOptions()),
            "t.yaml:2: tenants[0]: unknown field 'limits'");
}

TEST(YamlMessageTest, InlineFieldsAliasesAndSizes) {
  YamlMessageReader reader("t.yaml", ConfigOptions());
  v1::Daemon daemon;
  ASSERT_TRUE(reader
                  .ReadMessage(YAML::Load("batching:\n  max_batch_size: 4\n"
                                          "limits:\n  max_model_bytes: 2GiB\n"
                                          "  max_sealed_message_bytes: 1024\n"
                                          "tenants:\n  - id: a\n    weight: 3\n"),
                               daemon)
                  .ok());
  EXPECT_EQ(daemon.scheduler().max_batch_size(), 4u);
  EXPECT_TRUE(reader.Written("batching"));
  EXPECT_FALSE(reader.Written("scheduler"));
  EXPECT_EQ(daemon.limits().max_model_bytes(), uint64_t{2} << 30);
  EXPECT_EQ(daemon.limits().max_sealed_message_bytes(), 1024u);
  EXPECT_FALSE(daemon.limits().has_session_ttl_seconds());
  ASSERT_EQ(daemon.tenants_size(), 1);
  EXPECT_EQ(daemon.tenants(0).limits().weight(), 3u);
  EXPECT_TRUE(reader.Written("tenants[0].weight"));
  EXPECT_EQ(reader.ValueMark("tenants[0].weight").line, 7);

  EXPECT_EQ(ErrorOf<v1::Daemon>("scheduler: {}\nbatching: {}\n", ConfigOptions()),
            "t.yaml:2: batching: appears twice (first on line 1, as 'scheduler')");
}

TEST(YamlMessageTest, KeepGoingReportsEachEntryAndEachListElement) {
  YamlReadOptions options = ConfigOptions();
  options.keep_going = true;
  YamlMessageReader reader("t.yaml", options);
  v1::Daemon daemon;
  absl::Status status = reader.ReadMessage(YAML::Load("workers: 0\n"
                                                      "listen: [x]\n"
                                                      "data_dir: /d\n"
                                                      "tenants:\n"
                                                      "  - id: a\n"
                                                      "    weight: x\n"
                                                      "    burst: y\n"
                                                      "  - id: b\n"
                                                      "  - 7\n"),
                                           daemon);
  EXPECT_EQ(status.message(),
            "t.yaml:1: workers: 0 is outside 1..64\n"
            "t.yaml:2: listen: expected a string, got a list\n"
            "t.yaml:6: tenants[0].weight: expected an integer, got 'x'\n"  // the first in a map
            "t.yaml:9: tenants[2]: expected a map, got a scalar");
  ASSERT_EQ(reader.errors().size(), 4u);
  EXPECT_EQ(ErrorLine(reader.errors()[2]), 6);
  EXPECT_TRUE(reader.Failed("workers"));
  EXPECT_TRUE(reader.Failed("tenants"));
  EXPECT_TRUE(reader.Failed("tenants[0]"));
  EXPECT_TRUE(reader.Failed("tenants[0].weight"));
  EXPECT_FALSE(reader.Failed("tenants[1]"));
  EXPECT_FALSE(reader.Failed("data_dir"));
  EXPECT_EQ(daemon.data_dir(), "/d");
  EXPECT_EQ(daemon.tenants(1).id(), "b");
}

}  // namespace
}  // namespace cloister::proto
