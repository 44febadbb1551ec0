#include "host/config/daemon_config.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "cloister/config/v1/daemon.pb.h"
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
  EXPECT_EQ(config->scheduler.max_batch_size, 8);
  EXPECT_EQ(config->scheduler.max_queue_delay, absl::Milliseconds(2));
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
  EXPECT_EQ(config->scheduler.max_batch_size, 32);
  EXPECT_EQ(config->scheduler.max_queue_delay, absl::Microseconds(500));
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

TEST(DaemonConfigTest, SchedulerAndTenantLimits) {
  auto config = Parse(
      "workers: 3\n"
      "scheduler:\n"
      "  max_batch_size: 16\n"
      "  preferred_batch_sizes: [4, 8, 16]\n"
      "  max_queue_delay_ms: 1.5\n"
      "  max_batches_in_flight: 3\n"
      "  best_effort_max_batch_size: 4\n"
      "  best_effort_max_batch_time_ms: 10\n"
      "  fairness_quantum_ms: 0.5\n"
      "tenants:\n"
      "  - id: acme\n"
      "    token_sha256: " +
      kHash +
      "\n"
      "    priority: realtime\n"
      "    weight: 4\n"
      "    rate_per_second: 50\n"
      "    burst: 100\n"
      "    max_queued_requests: 64\n"
      "    max_queued_bytes: 16MiB\n"
      "    max_payload_bytes: 1048576\n"
      "    model_memory_quota_bytes: 2GiB\n"
      "    default_deadline_ms: 250\n"
      "  - id: globex\n"
      "    token_sha256: " +
      kHash +
      "\n"
      "tenant_defaults:\n"  // after the tenants: still applies to them
      "  priority: batch\n"
      "  max_queued_requests: 10\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->workers, 3);
  const SchedulerOptions& scheduler = config->scheduler;
  EXPECT_EQ(scheduler.max_batch_size, 16);
  EXPECT_EQ(scheduler.preferred_batch_sizes, (std::vector<int>{4, 8, 16}));
  EXPECT_EQ(scheduler.max_queue_delay, absl::Microseconds(1500));
  EXPECT_EQ(scheduler.max_batches_in_flight, 3);
  EXPECT_EQ(scheduler.best_effort_max_batch_size, 4);
  EXPECT_EQ(scheduler.best_effort_max_batch_time, absl::Milliseconds(10));
  EXPECT_EQ(scheduler.fairness_quantum, absl::Microseconds(500));
  EXPECT_EQ(scheduler.default_limits.priority, PriorityClass::kBatch);
  ASSERT_EQ(config->tenants.size(), 2u);
  const TenantLimits& acme = config->tenants[0].limits;
  EXPECT_EQ(acme.priority, PriorityClass::kRealtime);
  EXPECT_EQ(acme.weight, 4);
  EXPECT_EQ(acme.rate_per_second, 50);
  EXPECT_EQ(acme.burst, 100);
  EXPECT_EQ(acme.max_queued_requests, 64);
  EXPECT_EQ(acme.max_queued_size, uint64_t{16} << 20);
  EXPECT_EQ(acme.max_payload_size, uint64_t{1} << 20);
  EXPECT_EQ(acme.model_memory_quota, uint64_t{2} << 30);
  EXPECT_EQ(acme.default_deadline, absl::Milliseconds(250));
  const TenantLimits& globex = config->tenants[1].limits;
  EXPECT_EQ(globex.priority, PriorityClass::kBatch);
  EXPECT_EQ(globex.max_queued_requests, 10);
  EXPECT_EQ(globex.weight, 1);
  EXPECT_EQ(globex.default_deadline, absl::InfiniteDuration());
  EXPECT_EQ(scheduler.tenant_limits.at("acme").weight, 4);
  EXPECT_EQ(scheduler.tenant_limits.at("globex").priority, PriorityClass::kBatch);
  EXPECT_TRUE(CheckSchedulerOptions(scheduler).ok());
  ASSERT_EQ(config->Credentials().size(), 2u);
  EXPECT_EQ(config->Credentials()[1].tenant_id, "globex");
}

TEST(DaemonConfigTest, SchedulerAndLimitErrorsNameLineAndField) {
  const std::string tenant = "tenants:\n  - id: acme\n    token_sha256: " + kHash + "\n";
  EXPECT_EQ(ErrorOf("workers: 0\n"), "test.yaml:1: workers: 0 is outside 1..64");
  EXPECT_EQ(ErrorOf("scheduler:\n  preferred_batch_sizes: [4, 2]\n"),
            "test.yaml:2: scheduler.preferred_batch_sizes[1]: sizes must be in ascending order");
  EXPECT_EQ(ErrorOf("scheduler:\n  max_batch_size: 4\n  preferred_batch_sizes: [2, 8]\n"),
            "test.yaml:2: scheduler: preferred batch size 8 is larger than max_batch_size (4)");
  EXPECT_EQ(ErrorOf("scheduler:\n  max_batch_size: 4\n  best_effort_max_batch_size: 5\n"),
            "test.yaml:2: scheduler: best_effort_max_batch_size (5) is larger than "
            "max_batch_size (4)");
  EXPECT_EQ(ErrorOf("scheduler:\n  max_batch_size: 4\nbatching:\n  max_batch_size: 4\n"),
            "test.yaml:3: batching: the scheduler settings are already given as 'scheduler'");
  EXPECT_EQ(ErrorOf("scheduler:\n  fairness_quantum_ms: 0\n"),
            "test.yaml:2: scheduler.fairness_quantum_ms: 0 is outside 0.001..60000");
  EXPECT_EQ(ErrorOf("scheduler:\n  workers: 2\n"),
            "test.yaml:2: scheduler: unknown field 'workers'");
  EXPECT_EQ(ErrorOf(tenant + "    priority: urgent\n"),
            "test.yaml:4: tenants[0].priority: priority must be realtime, standard or batch, "
            "not 'urgent'");
  EXPECT_EQ(ErrorOf(tenant + "    weight: 0\n"),
            "test.yaml:4: tenants[0].weight: 0 is outside 1..10000");
  EXPECT_EQ(ErrorOf(tenant + "    max_queued_bytes: 16MB\n"),
            "test.yaml:4: tenants[0].max_queued_bytes: expected a size in bytes (like 1048576 "
            "or 64MiB), got '16MB'");
  EXPECT_EQ(ErrorOf(tenant + "    max_payload_bytes: 0\n"),
            "test.yaml:4: tenants[0].max_payload_bytes: must be at least 1 byte");
  EXPECT_EQ(ErrorOf(tenant + "    rate_per_second: -1\n"),
            "test.yaml:4: tenants[0].rate_per_second: -1 is outside 0..1e+09");
  EXPECT_EQ(ErrorOf(tenant + "    quota: 5\n"), "test.yaml:4: tenants[0]: unknown field 'quota'");
  EXPECT_EQ(ErrorOf("tenant_defaults:\n  weight: heavy\n"),
            "test.yaml:2: tenant_defaults.weight: expected an integer, got 'heavy'");
  EXPECT_EQ(ErrorOf("tenant_defaults: [1]\n"),
            "test.yaml:1: tenant_defaults: expected a map, got a list");
}

// The hand-written loader and the schema in daemon.proto name the same fields.
TEST(DaemonConfigTest, LoaderKnowsEveryFieldOfTheProtoSchema) {
  auto not_unknown = [](const std::string& text, const std::string& name) {
    absl::StatusOr<DaemonConfig> config = Parse(text);
    std::string message = config.ok() ? "" : std::string(config.status().message());
    EXPECT_EQ(message.find("unknown field"), std::string::npos) << name << ": " << message;
  };
  const google::protobuf::Descriptor* daemon = config::v1::Daemon::descriptor();
  for (int i = 0; i < daemon->field_count(); ++i) {
    not_unknown(daemon->field(i)->name() + ": [[1]]\n", daemon->field(i)->name());
  }
  const google::protobuf::Descriptor* scheduler = config::v1::Scheduler::descriptor();
  for (int i = 0; i < scheduler->field_count(); ++i) {
    not_unknown("scheduler:\n  " + scheduler->field(i)->name() + ": {bad: 1}\n",
                scheduler->field(i)->name());
  }
  const google::protobuf::Descriptor* limits = config::v1::TenantLimits::descriptor();
  for (int i = 0; i < limits->field_count(); ++i) {
    not_unknown("tenant_defaults:\n  " + limits->field(i)->name() + ": {bad: 1}\n",
                limits->field(i)->name());
    not_unknown("tenants:\n  - id: acme\n    token_sha256: " + kHash + "\n    " +
                    limits->field(i)->name() + ": {bad: 1}\n",
                limits->field(i)->name());
  }
  // Tenant's own fields other than the inline limits.
  EXPECT_NE(config::v1::Tenant::descriptor()->FindFieldByName("id"), nullptr);
  EXPECT_NE(config::v1::Tenant::descriptor()->FindFieldByName("token_sha256"), nullptr);
  // And a field the schema lacks is refused.
  EXPECT_NE(ErrorOf("scheduler:\n  bogus: 1\n").find("unknown field 'bogus'"), std::string::npos);
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
  EXPECT_EQ(ErrorOf("gpu: amd\n"),
            "test.yaml:1: gpu: gpu must be sim, nvidia-cc or none, not 'amd'");
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
