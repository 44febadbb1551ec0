#include "host/config/daemon_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "cloister/config/v1/daemon.pb.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

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
            "test.yaml:2: tenants[0]: missing field 'token_sha256' (or mtls_identities)");
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
      "  adaptive_queue_delay: false\n"
      "  max_batches_in_flight: 3\n"
      "  best_effort_max_batch_size: 4\n"
      "  best_effort_max_batch_time_ms: 10\n"
      "  fairness_quantum_ms: 0.5\n"
      "  realtime_arrival_guard_ms: 2\n"
      "  realtime_reserved_slots: 1\n"
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
      "    max_deadline_ms: 2000\n"
      "    max_generations: 8\n"
      "    max_tokens: 256\n"
      "    kv_cache_tokens: 4096\n"
      "    tokens_per_second: 500\n"
      "    token_burst: 2000\n"
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
  EXPECT_FALSE(scheduler.adaptive_queue_delay);
  EXPECT_EQ(scheduler.max_batches_in_flight, 3);
  EXPECT_EQ(scheduler.best_effort_max_batch_size, 4);
  EXPECT_EQ(scheduler.best_effort_max_batch_time, absl::Milliseconds(10));
  EXPECT_EQ(scheduler.realtime_arrival_guard, absl::Milliseconds(2));
  EXPECT_EQ(scheduler.realtime_reserved_slots, 1);
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
  EXPECT_EQ(acme.max_deadline, absl::Seconds(2));
  EXPECT_EQ(acme.max_generations, 8);
  EXPECT_EQ(acme.max_tokens, 256u);
  EXPECT_EQ(acme.kv_cache_tokens, 4096u);
  EXPECT_EQ(acme.tokens_per_second, 500);
  EXPECT_EQ(acme.token_burst, 2000);
  const TenantLimits& globex = config->tenants[1].limits;
  EXPECT_EQ(globex.priority, PriorityClass::kBatch);
  EXPECT_EQ(globex.max_queued_requests, 10);
  EXPECT_EQ(globex.weight, 1);
  EXPECT_EQ(globex.default_deadline, absl::InfiniteDuration());
  EXPECT_EQ(globex.max_deadline, absl::InfiniteDuration());
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
            "test.yaml:3: batching: appears twice (first on line 1, as 'scheduler')");
  EXPECT_EQ(ErrorOf("workers: 2\nworkers: 3\n"),
            "test.yaml:2: workers: appears twice (first on line 1)");
  EXPECT_EQ(ErrorOf("scheduler:\n  fairness_quantum_ms: 0\n"),
            "test.yaml:2: scheduler.fairness_quantum_ms: 0 is outside 0.001..60000");
  EXPECT_EQ(ErrorOf("scheduler:\n  max_batches_in_flight: 2\n  realtime_reserved_slots: 2\n"),
            "test.yaml:2: scheduler: realtime_reserved_slots (2) must be less than "
            "max_batches_in_flight (2)");
  EXPECT_EQ(ErrorOf("scheduler:\n  adaptive_queue_delay: sometimes\n"),
            "test.yaml:2: scheduler.adaptive_queue_delay: expected true or false, got 'sometimes'");
  EXPECT_EQ(ErrorOf("scheduler:\n  realtime_arrival_guard_ms: 5000\n"),
            "test.yaml:2: scheduler.realtime_arrival_guard_ms: 5000 is outside 0..1000");
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
  EXPECT_EQ(ErrorOf("tenant_defaults:\n  max_deadline_ms: 0.0001\n"),
            "test.yaml:2: tenant_defaults.max_deadline_ms: must be 0 (none) or at least 0.001");
  EXPECT_EQ(ErrorOf("tenant_defaults:\n  max_deadline_ms: -5\n"),
            "test.yaml:2: tenant_defaults.max_deadline_ms: -5 is outside 0..3.6e+06");
  EXPECT_EQ(ErrorOf("tenant_defaults: [1]\n"),
            "test.yaml:1: tenant_defaults: expected a map, got a list");
}

// Every field of the schema in daemon.proto is a key of the file.
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
  const google::protobuf::Descriptor* tenant = config::v1::Tenant::descriptor();
  for (int i = 0; i < tenant->field_count(); ++i) {
    if (tenant->field(i)->name() == "limits") continue;  // inline, checked above
    not_unknown("tenants:\n  - id: acme\n    token_sha256: " + kHash + "\n    " +
                    tenant->field(i)->name() + ": {bad: 1}\n",
                tenant->field(i)->name());
  }
  // The sections added for operators: each map's fields, and the list entries' fields.
  for (const auto& [section, message] :
       std::vector<std::pair<std::string, const google::protobuf::Descriptor*>>{
           {"tls", config::v1::Tls::descriptor()},
           {"operator", config::v1::Operator::descriptor()},
           {"limits", config::v1::Limits::descriptor()}}) {
    for (int i = 0; i < message->field_count(); ++i) {
      not_unknown(section + ":\n  " + message->field(i)->name() + ": {bad: 1}\n",
                  section + "." + message->field(i)->name());
    }
  }
  for (const auto& [section, message] :
       std::vector<std::pair<std::string, const google::protobuf::Descriptor*>>{
           {"devices", config::v1::Device::descriptor()},
           {"attestation_policies", config::v1::AttestationPolicyRef::descriptor()},
           {"published_models", config::v1::PublishedModel::descriptor()}}) {
    for (int i = 0; i < message->field_count(); ++i) {
      not_unknown(section + ":\n  - " + message->field(i)->name() + ": {bad: 1}\n",
                  section + "." + message->field(i)->name());
    }
  }
  // And a field the schema lacks is refused.
  EXPECT_NE(ErrorOf("scheduler:\n  bogus: 1\n").find("unknown field 'bogus'"), std::string::npos);
}

TEST(DaemonConfigTest, PublishedModels) {
  const std::string digest(64, 'A');
  auto config = ParseDaemonConfig(
      "published_models:\n  - name: Llama-3.1-8B_q\n    file: models/llama\n    digest: " +
          digest + "\n  - {name: bert, file: /srv/bert.onnx, digest: " + std::string(64, '0') +
          "}\n",
      "/etc/cloister/cloisterd.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->published_models.size(), 2u);
  EXPECT_EQ(config->published_models[0].name, "Llama-3.1-8B_q");
  EXPECT_EQ(config->published_models[0].file, "/etc/cloister/models/llama");
  EXPECT_EQ(config->published_models[0].digest, std::string(64, 'a'));
  EXPECT_EQ(config->published_models[1].file, "/srv/bert.onnx");

  EXPECT_EQ(ErrorOf("published_models:\n  - {name: a/b, file: x, digest: " + digest + "}\n"),
            "test.yaml:2: published_models[0].name: 'a/b' is not a model name: use A-Z, a-z, 0-9, "
            "., _ and -, at most 128 characters");
  EXPECT_EQ(ErrorOf("published_models:\n  - {name: a, file: x, digest: 12}\n"),
            "test.yaml:2: published_models[0].digest: expected 64 hex digits (the SHA-256 of the "
            "model), got '12'");
  EXPECT_EQ(ErrorOf("published_models:\n  - {name: a, digest: " + digest + "}\n"),
            "test.yaml:2: published_models[0].file: missing (an ONNX file, a model package or a "
            "folder)");
  EXPECT_EQ(ErrorOf("published_models:\n  - {name: a, file: x, digest: " + digest +
                    "}\n  - {name: a, file: y, digest: " + digest + "}\n"),
            "test.yaml:3: published_models[1].name: 'a' is published twice");
  // With file checks, the file must exist.
  auto missing = ParseDaemonConfig("published_models:\n  - {name: a, file: /nonexistent/m.onnx, "
                                   "digest: " + digest + "}\n",
                                   "test.yaml", FileChecks::kRead);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(
                "published_models[0].file: /nonexistent/m.onnx does not exist"),
            std::string::npos)
      << missing.status().message();
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
  std::string path = cloister::testing::MakeTempDir("daemon-config") + "/cloisterd.yaml";
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

TEST(DaemonConfigTest, OperatorSections) {
  std::string dir = cloister::testing::MakeTempDir("daemon-config-sections");
  std::filesystem::create_directories(dir + "/tls");
  std::string config_path = dir + "/cloisterd.yaml";
  auto config = ParseDaemonConfig(
      "tee: sev-snp\n"
      "gpu: nvidia-cc\n"
      "tls:\n"
      "  cert_file: tls/server.crt\n"
      "  key_file: /abs/server.key\n"
      "  client_ca_file: tls/ca.crt\n"
      "  require_client_cert: true\n"
      "operator:\n"
      "  listen: unix:/run/cloister/operator.sock\n"
      "devices:\n"
      "  - name: gpu0\n"
      "    executor: cuda\n"
      "    pcie_mode: driver\n"
      "    pci_address: \"0000:c1:00.0\"\n"
      "  - name: gpu1\n"
      "    gpu: none\n"
      "    executor: cpu\n"
      "    run_threads: 3\n"
      "limits:\n"
      "  max_model_bytes: 2GiB\n"
      "  max_sealed_message_bytes: 16MiB\n"
      "  session_ttl_seconds: 600\n"
      "  max_sessions_per_tenant: 50\n"
      "  upload_idle_timeout_seconds: 2.5\n"
      "  upload_timeout_seconds: 120\n"
      "attestation_policies:\n"
      "  - name: production\n"
      "    file: policies/prod.yaml\n"
      "  - name: strict\n"
      "    file: /etc/cloister/strict.yaml\n"
      "attestation_policy: production\n"
      "tenants:\n"
      "  - id: acme\n"
      "    token_sha256: " +
          kHash +
          "\n"
          "    mtls_identities: [spiffe://example.org/acme, acme.example.org]\n"
          "    attestation_policy: strict\n"
          "  - id: globex\n"
          "    token_sha256: " +
          kHash +
          "\n"
          "  - id: initech\n"  // no token: admitted by its client certificate alone
          "    mtls_identities: [initech.example.org]\n",
      config_path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tls.cert_file, dir + "/tls/server.crt");  // relative to the config file
  EXPECT_EQ(config->tls.key_file, "/abs/server.key");
  EXPECT_EQ(config->tls.client_ca_file, dir + "/tls/ca.crt");
  EXPECT_TRUE(config->tls.require_client_cert);
  EXPECT_EQ(config->operator_api.listen, "unix:/run/cloister/operator.sock");
  ASSERT_EQ(config->devices.size(), 2u);
  EXPECT_EQ(config->workers, 2);
  std::vector<DeviceConfig> workers = config->Workers();
  EXPECT_EQ(workers[0].gpu, "nvidia-cc");  // the daemon's
  EXPECT_EQ(workers[0].pcie_mode, "driver");
  EXPECT_EQ(workers[0].pci_address, "0000:c1:00.0");
  EXPECT_EQ(workers[1].gpu, "none");
  EXPECT_EQ(workers[1].run_threads, 3);
  EXPECT_EQ(workers[0].run_threads, 0);  // the worker's default
  EXPECT_EQ(config->limits.max_model_size, uint64_t{2} << 30);
  EXPECT_EQ(config->limits.max_sealed_message_size, uint64_t{16} << 20);
  EXPECT_EQ(config->limits.session_ttl, absl::Seconds(600));
  EXPECT_EQ(config->limits.max_sessions_per_tenant, 50);
  EXPECT_EQ(config->limits.upload_idle_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(config->limits.upload_timeout, absl::Seconds(120));
  ASSERT_EQ(config->attestation_policies.size(), 2u);
  EXPECT_EQ(config->attestation_policies[0].file, dir + "/policies/prod.yaml");
  ASSERT_EQ(config->tenants.size(), 3u);
  EXPECT_EQ(config->tenants[0].mtls_identities.size(), 2u);
  EXPECT_TRUE(config->tenants[2].token_sha256.empty());
  EXPECT_EQ(config->tenants[2].mtls_identities.size(), 1u);
  EXPECT_EQ(config->tenants[0].attestation_policy, "strict");
  EXPECT_EQ(config->tenants[1].attestation_policy, "production");  // the default
  EXPECT_NE(DescribeDaemonConfig(*config).find("mutual TLS (required)"), std::string::npos);

  // Without devices, `workers` workers with the daemon's gpu.
  auto plain = Parse("workers: 3\n");
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->Workers().size(), 3u);
  EXPECT_EQ(plain->Workers()[2].name, "worker2");
  std::filesystem::remove_all(dir);
}

TEST(DaemonConfigTest, OperatorSectionErrorsNameLineAndField) {
  EXPECT_EQ(ErrorOf("tls:\n  cert_file: a.crt\n"),
            "test.yaml:2: tls.key_file: missing: cert_file and key_file go together");
  EXPECT_EQ(ErrorOf("tls:\n  cert_file: a\n  key_file: b\n  require_client_cert: true\n"),
            "test.yaml:2: tls.require_client_cert: needs tls.client_ca_file (the CA that issues "
            "client certificates)");
  EXPECT_EQ(ErrorOf("tls:\n  cert_file: a\n  key_file: b\n  require_client_cert: yes\n"),
            "test.yaml:4: tls.require_client_cert: expected true or false, got 'yes'");
  EXPECT_EQ(ErrorOf("tls:\n  cert: a\n"), "test.yaml:2: tls: unknown field 'cert'");
  EXPECT_NE(ErrorOf("operator:\n  listen: 10.1.2.3:7701\n")
                .find("test.yaml:2: operator.listen: '10.1.2.3:7701' is not loopback"),
            std::string::npos);
  EXPECT_TRUE(Parse("operator:\n  listen: 10.1.2.3:7701\n  allow_remote: true\n").ok());
  EXPECT_TRUE(Parse("operator:\n  listen: \"[::1]:7701\"\n").ok());
  EXPECT_TRUE(Parse("operator:\n  metrics_listen: 127.0.0.1:9100\n").ok());
  EXPECT_NE(ErrorOf("operator:\n  listen: unix:/run/op.sock\n  metrics_listen: 0.0.0.0:9100\n")
                .find("test.yaml:3: operator.metrics_listen: '0.0.0.0:9100' is not loopback"),
            std::string::npos);
  EXPECT_EQ(ErrorOf("operator:\n  metrics_listen: unix:/x\n"),
            "test.yaml:2: operator.metrics_listen: the metrics endpoint is HTTP on HOST:PORT, not "
            "a unix socket");
  EXPECT_EQ(ErrorOf("operator:\n  listen: \"unix:\"\n"),
            "test.yaml:2: operator.listen: 'unix:' needs a socket path, like "
            "unix:/run/cloister/op.sock");
  EXPECT_EQ(ErrorOf("devices: []\n"), "test.yaml:1: devices: must list at least one device");
  EXPECT_EQ(ErrorOf("devices:\n  - gpu: sim\n"), "test.yaml:2: devices[0]: missing field 'name'");
  EXPECT_EQ(ErrorOf("devices:\n  - name: GPU 0\n"),
            "test.yaml:2: devices[0].name: 'GPU 0' is not a name: use a-z, 0-9, _ and -, at most "
            "32 characters");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n    pcie_mode: fast\n"),
            "test.yaml:3: devices[0].pcie_mode: pcie_mode must be driver, emulated or off, not "
            "'fast'");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n    run_threads: 65\n"),
            "test.yaml:3: devices[0].run_threads: 65 is outside 1..64");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n    gpu: nvidia-cc\n    executor: cuda\n"
                    "    run_threads: 2\n"),
            "test.yaml:5: devices[0].run_threads: applies to the CPU executor only; this device "
            "has executor cuda");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n    pci_address: c1:00.0\n"),
            "test.yaml:3: devices[0].pci_address: 'c1:00.0' is not a PCI address like "
            "0000:c1:00.0");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n  - name: a\n"),
            "test.yaml:3: devices[1].name: device 'a' is listed twice");
  EXPECT_EQ(ErrorOf("devices:\n  - name: a\n    gpu: sim\n    executor: cuda\n"),
            "test.yaml:4: devices[0].executor: cuda needs a GPU; this device has gpu sim");
  EXPECT_EQ(ErrorOf("tee: sim\ndevices:\n  - name: a\n    gpu: nvidia-cc\n"),
            "test.yaml:3: devices[0].gpu: gpu nvidia-cc needs tee sev-snp or tdx (a simulated CVM "
            "cannot vouch for a real GPU)");
  EXPECT_EQ(ErrorOf("workers: 2\ndevices:\n  - name: a\n"),
            "test.yaml:1: workers: 2 workers but 1 devices: drop workers, devices decide");
  EXPECT_EQ(ErrorOf("limits:\n  session_ttl_seconds: 5\n"),
            "test.yaml:2: limits.session_ttl_seconds: 5 is outside 60..86400");
  EXPECT_EQ(ErrorOf("limits:\n  upload_idle_timeout_seconds: 0\n"),
            "test.yaml:2: limits.upload_idle_timeout_seconds: 0 is outside 1..3600");
  EXPECT_EQ(ParseDaemonConfig("", "test.yaml")->limits.upload_idle_timeout, absl::Seconds(60));
  EXPECT_EQ(ParseDaemonConfig("", "test.yaml")->limits.upload_timeout, absl::Minutes(30));
  EXPECT_EQ(ErrorOf("limits:\n  upload_timeout_seconds: 100000\n"),
            "test.yaml:2: limits.upload_timeout_seconds: 100000 is outside 1..86400");
  EXPECT_EQ(
      ErrorOf("limits:\n  max_sealed_message_bytes: 2GiB\n"),
      "test.yaml:2: limits.max_sealed_message_bytes: must be at most 1GiB (one gRPC message)");
  EXPECT_EQ(ErrorOf("attestation_policies:\n  - name: a\n"),
            "test.yaml:2: attestation_policies[0]: missing field 'file'");
  EXPECT_EQ(ErrorOf("attestation_policies:\n  - {name: a, file: x}\n  - {name: a, file: y}\n"),
            "test.yaml:3: attestation_policies[1].name: policy 'a' is listed twice");
  EXPECT_EQ(ErrorOf("attestation_policy: nope\n"),
            "test.yaml:1: attestation_policy: no attestation policy named 'nope' in "
            "attestation_policies");
  EXPECT_EQ(ErrorOf("tenants:\n  - id: acme\n    token_sha256: " + kHash +
                    "\n    mtls_identities: [acme]\n"),
            "test.yaml:4: tenants[0].mtls_identities: client identities need tls.client_ca_file "
            "(mutual TLS)");
  EXPECT_EQ(ErrorOf("tenants:\n  - id: acme\n    token_sha256: " + kHash +
                    "\n    attestation_policy: missing\n"),
            "test.yaml:4: tenants[0].attestation_policy: no attestation policy named 'missing' in "
            "attestation_policies");
}

TEST(DaemonConfigTest, EveryBrokenSectionIsReported) {
  EXPECT_EQ(ErrorOf("workers: 0\n"
                    "listen: nowhere\n"
                    "tenants:\n"
                    "  - id: a\n"
                    "  - id: b\n"
                    "    token_sha256: " +
                    kHash +
                    "\n"
                    "  - id: c\n"
                    "    token_sha256: 12\n"),
            "test.yaml:1: workers: 0 is outside 1..64\n"
            "test.yaml:2: listen: listen address 'nowhere' is not HOST:PORT\n"
            "test.yaml:4: tenants[0]: missing field 'token_sha256' (or mtls_identities)\n"
            "test.yaml:8: tenants[2].token_sha256: expected 64 hex digits (the SHA-256 of the "
            "tenant's API token)");
}

TEST(DaemonConfigTest, FileChecksReadWhatTheConfigNames) {
  std::string dir = cloister::testing::MakeTempDir("daemon-config-files");
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text, int mode = 0600) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + name, text, mode).ok());
    ::chmod((dir + "/" + name).c_str(), mode);
  };
  const std::string cert = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";
  const std::string key = "-----BEGIN EC PRIVATE KEY-----\nMA==\n-----END EC PRIVATE KEY-----\n";
  write("server.crt", cert, 0644);
  write("server.key", key, 0600);
  write("snp.yaml", "name: p\ntee: sev-snp\ngpu: nvidia-cc\n", 0644);
  write("tdx.yaml", "name: q\ntee: tdx\ngpu: none\n", 0644);
  const std::string path = dir + "/cloisterd.yaml";
  const std::string base =
      "tee: sev-snp\ngpu: nvidia-cc\ntls:\n  cert_file: server.crt\n  key_file: server.key\n";
  auto load = [&](const std::string& text) {
    return ParseDaemonConfig(text, path, FileChecks::kRead);
  };
  auto good = load(base + "attestation_policies:\n  - name: p\n    file: snp.yaml\n");
  EXPECT_TRUE(good.ok()) << good.status();

  auto mismatch = load(base + "attestation_policies:\n  - name: q\n    file: tdx.yaml\n");
  ASSERT_FALSE(mismatch.ok());
  std::string message(mismatch.status().message());
  EXPECT_NE(message.find(path + ":8: attestation_policies[0].file: " + dir +
                         "/tdx.yaml is for tee tdx but this daemon's tee is sev-snp"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("is for gpu none but this daemon's workers report gpu nvidia-cc"),
            std::string::npos)
      << message;

  auto missing = load(base + "attestation_policies:\n  - name: p\n    file: gone.yaml\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path + ":8: attestation_policies[0].file: "),
            std::string::npos)
      << missing.status();
  // The same file without file checks loads (a config written for another machine).
  EXPECT_TRUE(ParseDaemonConfig(base + "attestation_policies:\n  - name: p\n    file: gone.yaml\n",
                                path, FileChecks::kSkip)
                  .ok());

  write("server.key", cert, 0600);  // a certificate where the key belongs
  auto wrong_kind = load(base);
  ASSERT_FALSE(wrong_kind.ok());
  EXPECT_NE(wrong_kind.status().message().find(path + ":5: tls.key_file: " + dir +
                                               "/server.key holds no PEM PRIVATE KEY"),
            std::string::npos)
      << wrong_kind.status();
  write("server.key", key, 0644);  // readable by every user
  auto exposed = load(base);
  ASSERT_FALSE(exposed.ok());
  EXPECT_NE(exposed.status().message().find("is readable by every user"), std::string::npos)
      << exposed.status();
  std::filesystem::remove_all(dir);
}

TEST(DaemonConfigTest, CheckConfigFlags) {
  auto parsed = ParseArgs({"--check-config", "c.yaml", "--skip-file-checks"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->check_config, "c.yaml");
  EXPECT_TRUE(parsed->skip_file_checks);
  EXPECT_EQ(ParseArgs({"--skip-file-checks"}).status().message(),
            "--skip-file-checks only goes with --check-config FILE");
  EXPECT_EQ(ParseArgs({"--check-config"}).status().message(), "flag --check-config needs a value");
}

}  // namespace
}  // namespace cloister::host
