#include "host/config/daemon_config.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

const std::string kHash(64, 'a');

absl::StatusOr<DaemonConfig> Parse(const std::string& text) {
  return ParseDaemonConfig(text, "test.yaml");
}

// The error message of a config that must fail.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<DaemonConfig> config = Parse(text);
  EXPECT_FALSE(config.ok()) << text;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(DaemonConfigTest, EmptyGivesDefaults) {
  auto config = Parse("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "127.0.0.1:7700");
  EXPECT_EQ(config->data_dir, "./cloister-data");
  EXPECT_EQ(config->enclave_binary, "");
  EXPECT_EQ(config->max_batch_size, 8);
  EXPECT_EQ(config->max_queue_delay, absl::Milliseconds(2));
  EXPECT_TRUE(config->tenants.empty());
}

TEST(DaemonConfigTest, FullConfig) {
  auto config = Parse(
      "listen: 0.0.0.0:9000\n"
      "data_dir: /var/lib/cloister\n"
      "enclave_binary: /opt/cloister/cloister-enclave\n"
      "batching:\n"
      "  max_batch_size: 32\n"
      "  max_queue_delay_ms: 0.5\n"
      "tenants:\n"
      "  - id: acme\n"
      "    token_sha256: " +
      kHash +
      "\n"
      "  - id: globex\n"
      "    token_sha256: " +
      std::string(64, 'B') + "\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "0.0.0.0:9000");
  EXPECT_EQ(config->data_dir, "/var/lib/cloister");
  EXPECT_EQ(config->enclave_binary, "/opt/cloister/cloister-enclave");
  EXPECT_EQ(config->max_batch_size, 32);
  EXPECT_EQ(config->max_queue_delay, absl::Microseconds(500));
  ASSERT_EQ(config->tenants.size(), 2u);
  EXPECT_EQ(config->tenants[0].tenant_id, "acme");
  EXPECT_EQ(config->tenants[0].token_sha256, Bytes(32, 0xaa));
  EXPECT_EQ(config->tenants[1].token_sha256, Bytes(32, 0xbb));
}

TEST(DaemonConfigTest, ErrorsNameFileLineAndField) {
  EXPECT_EQ(ErrorOf("listen: 127.0.0.1:1\nport: 7\n"), "test.yaml:2: unknown field 'port'");
  EXPECT_EQ(ErrorOf("batching:\n  max_batch_size: lots\n"),
            "test.yaml:2: batching.max_batch_size: expected an integer, got 'lots'");
  EXPECT_EQ(ErrorOf("batching:\n  max_batch_size: 0\n"),
            "test.yaml:2: batching.max_batch_size: 0 is outside 1..1024");
  EXPECT_EQ(ErrorOf("batching:\n  max_batch: 4\n"),
            "test.yaml:2: batching: unknown field 'max_batch'");
  EXPECT_EQ(ErrorOf("batching:\n  max_queue_delay_ms: -1\n"),
            "test.yaml:2: batching.max_queue_delay_ms: -1 is outside 0..10000");
  EXPECT_EQ(ErrorOf("batching: 5\n"), "test.yaml:1: batching: expected a map, got a scalar");
  EXPECT_EQ(ErrorOf("listen: [a, b]\n"), "test.yaml:1: listen: expected a string, got a list");
  EXPECT_EQ(ErrorOf("listen: localhost\n"),
            "test.yaml:1: listen: listen address 'localhost' is not HOST:PORT");
  EXPECT_EQ(ErrorOf("\n\ntenants: {}\n"), "test.yaml:3: tenants: expected a list, got a map");
  EXPECT_EQ(ErrorOf("tenants:\n  - id: acme\n"),
            "test.yaml:2: tenants[0]: missing field 'token_sha256'");
  EXPECT_EQ(ErrorOf("tenants:\n  - id: acme\n    token_sha256: abc\n"),
            "test.yaml:3: tenants[0].token_sha256: expected 64 hex digits (the SHA-256 of the "
            "tenant's API token)");
  EXPECT_EQ(ErrorOf("tenants:\n  - id: acme\n    token: x\n"),
            "test.yaml:3: tenants[0]: unknown field 'token'");
  EXPECT_NE(ErrorOf("tenants:\n  - id: ../x\n    token_sha256: " + kHash + "\n")
                .find("test.yaml:2: tenants[0].id: invalid tenant id"),
            std::string::npos);
  EXPECT_EQ(ErrorOf("tenants:\n  - id: a\n    token_sha256: " + kHash +
                    "\n  - id: a\n"
                    "    token_sha256: " +
                    kHash + "\n"),
            "test.yaml:4: tenants[1].id: tenant 'a' is listed twice");
  EXPECT_EQ(ErrorOf("- 1\n- 2\n"), "test.yaml:1: expected a map of settings, got a list");
}

TEST(DaemonConfigTest, SyntaxErrorsNameTheLine) {
  std::string message = ErrorOf("listen: 127.0.0.1:1\nbatching: [\n");
  EXPECT_EQ(message.rfind("test.yaml:", 0), 0u) << message;
  EXPECT_NE(message.find("YAML syntax error"), std::string::npos) << message;
}

TEST(DaemonConfigTest, ListenAddresses) {
  EXPECT_TRUE(CheckListenAddress("127.0.0.1:0").ok());
  EXPECT_TRUE(CheckListenAddress("[::1]:7700").ok());
  EXPECT_TRUE(CheckListenAddress("localhost:65535").ok());
  EXPECT_FALSE(CheckListenAddress("127.0.0.1").ok());
  EXPECT_FALSE(CheckListenAddress(":7700").ok());
  EXPECT_FALSE(CheckListenAddress("127.0.0.1:65536").ok());
  EXPECT_FALSE(CheckListenAddress("127.0.0.1:-1").ok());
  EXPECT_FALSE(CheckListenAddress("127.0.0.1:").ok());
  EXPECT_FALSE(CheckListenAddress("::1:7700").ok());
  EXPECT_EQ(ListenHost("[::1]:0"), "[::1]");
  EXPECT_EQ(ListenHost("127.0.0.1:0"), "127.0.0.1");
}

absl::StatusOr<CommandLine> ParseArgs(std::vector<const char*> args) {
  args.insert(args.begin(), "cloisterd");
  return ParseCommandLine(static_cast<int>(args.size()), args.data());
}

TEST(DaemonConfigTest, EvidenceSources) {
  auto config = Parse("tee: sev-snp\ngpu: nvidia-cc\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tee, "sev-snp");
  EXPECT_EQ(config->gpu, "nvidia-cc");
  config = Parse("");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->tee, "sim");
  EXPECT_EQ(config->gpu, "");
  EXPECT_TRUE(Parse("tee: tdx\ngpu: none\n").ok());
  EXPECT_TRUE(Parse("gpu: sim\ntee: sim\n").ok());

  EXPECT_EQ(ErrorOf("listen: 127.0.0.1:1\ntee: sgx\n"),
            "test.yaml:2: tee: tee must be sim, sev-snp or tdx, not 'sgx'");
  EXPECT_EQ(ErrorOf("gpu: amd\n"), "test.yaml:1: gpu: gpu must be sim, nvidia-cc or none, not 'amd'");
  EXPECT_EQ(ErrorOf("tee: sim\ngpu: nvidia-cc\n"),
            "test.yaml:2: gpu: gpu nvidia-cc needs tee sev-snp or tdx (a simulated CVM cannot "
            "vouch for a real GPU)");
  EXPECT_EQ(ErrorOf("gpu: sim\ntee: tdx\n"),
            "test.yaml:2: tee: gpu sim needs tee sim (a simulated GPU cannot sit in a tdx CVM)");

  CommandLine command_line;
  command_line.tee = "sev-snp";
  auto resolved = ResolveDaemonConfig(command_line);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->tee, "sev-snp");
  command_line.gpu = "sim";
  EXPECT_EQ(ResolveDaemonConfig(command_line).status().message(),
            "--tee/--gpu: gpu sim needs tee sim (a simulated GPU cannot sit in a sev-snp CVM)");
  auto parsed = ParseArgs({"--tee", "tdx", "--gpu=none"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->tee, "tdx");
  EXPECT_EQ(parsed->gpu, "none");
}

TEST(DaemonConfigTest, CommandLine) {
  auto parsed = ParseArgs({"--listen", "127.0.0.1:0", "--data-dir=/tmp/x", "--enclave-binary",
                           "/bin/e", "--config", "c.yaml"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->listen, "127.0.0.1:0");
  EXPECT_EQ(parsed->data_dir, "/tmp/x");
  EXPECT_EQ(parsed->enclave_binary, "/bin/e");
  EXPECT_EQ(parsed->config_path, "c.yaml");
  EXPECT_FALSE(parsed->help);
  EXPECT_TRUE(ParseArgs({"--help"})->help);

  EXPECT_EQ(ParseArgs({"--bogus"}).status().message(), "unknown flag --bogus");
  EXPECT_EQ(ParseArgs({"--bogus=1"}).status().message(), "unknown flag --bogus");
  EXPECT_EQ(ParseArgs({"--listen"}).status().message(), "flag --listen needs a value");
  EXPECT_EQ(ParseArgs({"--listen="}).status().message(), "flag --listen needs a value");
  EXPECT_EQ(ParseArgs({"serve"}).status().message(), "unexpected argument 'serve'");
}

TEST(DaemonConfigTest, FlagsOverrideTheFile) {
  std::string path = std::string(::testing::TempDir()) + "/daemon_config_test_" +
                     std::to_string(::getpid()) + ".yaml";
  ASSERT_TRUE(WriteFileAtomic(path, "listen: 10.0.0.1:1\ndata_dir: /from/file\n").ok());
  CommandLine command_line;
  command_line.config_path = path;
  command_line.listen = "127.0.0.1:0";
  auto config = ResolveDaemonConfig(command_line);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "127.0.0.1:0");
  EXPECT_EQ(config->data_dir, "/from/file");

  command_line.listen = "nonsense";
  EXPECT_EQ(ResolveDaemonConfig(command_line).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);

  command_line.listen.reset();
  auto missing = ResolveDaemonConfig(command_line);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace cloister::host
