#include "host/config/config_reloader.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

namespace fs = std::filesystem;

std::string HashOf(const std::string& token) { return HexEncode(TokenHash(token)); }

std::string TenantYaml(const std::string& id, const std::string& token,
                       const std::string& extra = "") {
  return absl::StrCat("  - id: ", id, "\n    token_sha256: ", HashOf(token), "\n", extra);
}

class ConfigReloaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("reloader");
    ASSERT_FALSE(dir_.empty());
    path_ = (dir_ / "cloisterd.yaml").string();
    SetLogSinkForTest([this](const std::string& line) { log_.push_back(line); });
  }
  void TearDown() override {
    SetLogSinkForTest(nullptr);
    fs::remove_all(dir_);
  }

  void Write(const std::string& text) { ASSERT_TRUE(WriteFileAtomic(path_, text, 0600).ok()); }

  // Loads the file as the daemon would at start and builds the reloader over a registry.
  void Start(std::vector<TenantCredential> development = {}) {
    auto config = LoadDaemonConfig(path_);
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<TenantCredential> credentials = config->Credentials();
    if (credentials.empty()) credentials = development;
    auto registry = TenantRegistry::Create(credentials);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    identities_ = std::make_unique<TenantIdentityCheck>(config->tenants);
    reloader_ = std::make_unique<ConfigReloader>(
        *config, ConfigReloader::Targets{.registry = registry_.get(),
                                         .identities = identities_.get(),
                                         .development_tenants = development});
  }

  bool Admits(const std::string& tenant, const std::string& token) {
    return registry_->Authenticate(tenant, token).ok();
  }
  bool Logged(const std::string& event) {
    return std::any_of(log_.begin(), log_.end(), [&](const std::string& line) {
      return line.find("\"event\":\"" + event + "\"") != std::string::npos;
    });
  }

  fs::path dir_;
  std::string path_;
  std::vector<std::string> log_;
  std::unique_ptr<TenantRegistry> registry_;
  std::unique_ptr<TenantIdentityCheck> identities_;
  std::unique_ptr<ConfigReloader> reloader_;
};

TEST_F(ConfigReloaderTest, AddsRemovesAndRotatesTenants) {
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "acme-1"), TenantYaml("globex", "globex-1")));
  Start();
  EXPECT_TRUE(Admits("acme", "acme-1"));
  EXPECT_TRUE(Admits("globex", "globex-1"));

  // acme rotates its token, globex leaves, initech arrives.
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "acme-2"), TenantYaml("initech", "ini-1")));
  auto outcome = reloader_->ReloadConfig();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tenant_count, 2);
  EXPECT_EQ(outcome->tenants_added, std::vector<std::string>{"initech"});
  EXPECT_EQ(outcome->tenants_removed, std::vector<std::string>{"globex"});
  EXPECT_EQ(outcome->tenants_changed, std::vector<std::string>{"acme"});
  EXPECT_TRUE(outcome->restart_needed.empty()) << outcome->restart_needed[0];
  EXPECT_FALSE(Admits("acme", "acme-1"));
  EXPECT_TRUE(Admits("acme", "acme-2"));
  EXPECT_FALSE(Admits("globex", "globex-1"));
  EXPECT_TRUE(Admits("initech", "ini-1"));
  EXPECT_TRUE(Logged("config_reloaded"));
  EXPECT_EQ(reloader_->config()->tenants.size(), 2u);
}

TEST_F(ConfigReloaderTest, BadFileIsRefusedAndTheOldConfigStays) {
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "acme-1")));
  Start();
  // Two mistakes: both are named, nothing is applied.
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "acme-2"), TenantYaml("globex", "g"),
                     "    weight: 0\n", "bogus: 1\n"));
  auto outcome = reloader_->ReloadConfig();
  ASSERT_FALSE(outcome.ok());
  std::string message(outcome.status().message());
  EXPECT_NE(message.find(path_ + ":6: tenants[1].weight: 0 is outside 1..10000"), std::string::npos)
      << message;
  EXPECT_NE(message.find(path_ + ":7: unknown field 'bogus'"), std::string::npos) << message;
  EXPECT_TRUE(Admits("acme", "acme-1"));
  EXPECT_FALSE(Admits("acme", "acme-2"));
  EXPECT_TRUE(Logged("config_reload_refused"));
  EXPECT_EQ(reloader_->config()->tenants[0].token_sha256, TokenHash("acme-1"));

  // A file that vanished is refused the same way.
  fs::remove(path_);
  EXPECT_FALSE(reloader_->ReloadConfig().ok());
  EXPECT_TRUE(Admits("acme", "acme-1"));
}

TEST_F(ConfigReloaderTest, RestartOnlyChangesAreReportedNotApplied) {
  Write(absl::StrCat("listen: 127.0.0.1:7700\nscheduler:\n  max_batch_size: 8\ntenants:\n",
                     TenantYaml("acme", "a", "    weight: 2\n")));
  Start();
  Write(absl::StrCat("listen: 127.0.0.1:7800\nscheduler:\n  max_batch_size: 16\ntenants:\n",
                     TenantYaml("acme", "a", "    weight: 3\n"), TenantYaml("globex", "g")));
  auto outcome = reloader_->ReloadConfig();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  std::vector<std::string> expected = {"listen", "scheduler.max_batch_size", "tenants.acme.limits"};
  EXPECT_EQ(outcome->restart_needed, expected);
  EXPECT_TRUE(Logged("config_reload_needs_restart"));
  EXPECT_EQ(reloader_->config()->listen, "127.0.0.1:7700");  // still the running one
  EXPECT_TRUE(Admits("globex", "g"));
}

TEST_F(ConfigReloaderTest, FlagsOverridesAreNotReportedAsChanges) {
  Write(absl::StrCat("listen: 127.0.0.1:7700\ntenants:\n", TenantYaml("acme", "a")));
  CommandLine command_line;
  command_line.config_path = path_;
  command_line.listen = "127.0.0.1:0";
  auto config = ResolveDaemonConfig(command_line);
  ASSERT_TRUE(config.ok()) << config.status();
  auto registry = TenantRegistry::Create(config->Credentials());
  ASSERT_TRUE(registry.ok());
  ConfigReloader reloader(*config, {.registry = registry->get()});
  auto outcome = reloader.ReloadConfig();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->restart_needed.empty()) << outcome->restart_needed[0];
}

TEST_F(ConfigReloaderTest, DevelopmentTenantComesBackWhenTheListEmpties) {
  Write("listen: 127.0.0.1:7700\n");
  Start({{kDevTenantId, TokenHash("dev-token")}});
  EXPECT_TRUE(Admits("demo", "dev-token"));
  Write(absl::StrCat("listen: 127.0.0.1:7700\ntenants:\n", TenantYaml("acme", "a")));
  ASSERT_TRUE(reloader_->ReloadConfig().ok());
  EXPECT_FALSE(Admits("demo", "dev-token"));
  EXPECT_TRUE(Admits("acme", "a"));
  Write("listen: 127.0.0.1:7700\n");
  ASSERT_TRUE(reloader_->ReloadConfig().ok());
  EXPECT_TRUE(Admits("demo", "dev-token"));
}

TEST_F(ConfigReloaderTest, EmptyingConfiguredTenantsIsRefused) {
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "a")));
  Start();
  Write("tenants: []\n");
  auto outcome = reloader_->ReloadConfig();
  ASSERT_FALSE(outcome.ok());
  EXPECT_NE(outcome.status().message().find("lists no tenants"), absl::string_view::npos);
  EXPECT_TRUE(Admits("acme", "a"));
}

TEST_F(ConfigReloaderTest, ChangedTeeIsRefused) {
  Write(absl::StrCat("tee: sim\ntenants:\n", TenantYaml("acme", "a")));
  Start();
  Write(absl::StrCat("tee: tdx\ntenants:\n", TenantYaml("acme", "b")));
  auto outcome = reloader_->ReloadConfig();
  ASSERT_FALSE(outcome.ok());
  EXPECT_NE(outcome.status().message().find("tee"), absl::string_view::npos);
  EXPECT_TRUE(Admits("acme", "a"));
}

TEST_F(ConfigReloaderTest, IdentitiesReloadWithTheTenants) {
  ASSERT_TRUE(WriteFileAtomic((dir_ / "ca.crt").string(),
                              "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n",
                              0644)
                  .ok());
  ASSERT_TRUE(WriteFileAtomic((dir_ / "server.crt").string(),
                              "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n",
                              0644)
                  .ok());
  ASSERT_TRUE(WriteFileAtomic((dir_ / "server.key").string(),
                              "-----BEGIN PRIVATE KEY-----\nMA==\n-----END PRIVATE KEY-----\n",
                              0600)
                  .ok());
  std::string tls =
      "tls:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n";
  Write(absl::StrCat(tls, "tenants:\n", TenantYaml("acme", "a", "    mtls_identities: [old]\n")));
  Start();
  EXPECT_TRUE(identities_->Check("acme", {"old"}).ok());
  Write(absl::StrCat(tls, "tenants:\n", TenantYaml("acme", "a", "    mtls_identities: [new]\n")));
  auto outcome = reloader_->ReloadConfig();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tenants_changed, std::vector<std::string>{"acme"});
  EXPECT_FALSE(identities_->Check("acme", {"old"}).ok());
  EXPECT_TRUE(identities_->Check("acme", {"new"}).ok());
}

TEST_F(ConfigReloaderTest, IdentitiesNeedAPortThatStartedWithAClientCa) {
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "a")));
  auto config = LoadDaemonConfig(path_);
  ASSERT_TRUE(config.ok());
  auto registry = TenantRegistry::Create(config->Credentials());
  ASSERT_TRUE(registry.ok());
  ConfigReloader reloader(*config, {.registry = registry->get(), .identities = nullptr});
  const std::string pem = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";
  ASSERT_TRUE(WriteFileAtomic((dir_ / "ca.crt").string(), pem, 0644).ok());
  ASSERT_TRUE(WriteFileAtomic((dir_ / "s.crt").string(), pem, 0644).ok());
  ASSERT_TRUE(WriteFileAtomic((dir_ / "s.key").string(),
                              "-----BEGIN PRIVATE KEY-----\nMA==\n-----END PRIVATE KEY-----\n",
                              0600)
                  .ok());
  Write(absl::StrCat("tls:\n  cert_file: s.crt\n  key_file: s.key\n  client_ca_file: ca.crt\n",
                     "tenants:\n", TenantYaml("acme", "b", "    mtls_identities: [acme]\n")));
  auto outcome = reloader.ReloadConfig();
  ASSERT_FALSE(outcome.ok());
  EXPECT_NE(outcome.status().message().find("restart cloisterd to turn on mutual TLS"),
            absl::string_view::npos)
      << outcome.status();
  EXPECT_TRUE((*registry)->Authenticate("acme", "a").ok());  // unchanged
}

TEST_F(ConfigReloaderTest, WithoutAConfigFileThereIsNothingToReload) {
  DaemonConfig defaults;
  auto registry = TenantRegistry::Create({{kDevTenantId, TokenHash("t")}});
  ASSERT_TRUE(registry.ok());
  ConfigReloader reloader(defaults, {.registry = registry->get()});
  auto outcome = reloader.ReloadConfig();
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kFailedPrecondition);
  // An explicit path works.
  Write(absl::StrCat("tenants:\n", TenantYaml("acme", "a")));
  EXPECT_TRUE(reloader.ReloadConfig(path_).ok());
  EXPECT_TRUE((*registry)->Authenticate("acme", "a").ok());
}

}  // namespace
}  // namespace cloister::host
