#include "host/tenants/tenant_registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

std::vector<TenantCredential> TwoTenants() {
  return {{"acme", TokenHash("acme-token")}, {"globex", TokenHash("globex-token")}};
}

TEST(TenantRegistryTest, AuthenticatesTheRightToken) {
  auto registry = TenantRegistry::Create(TwoTenants());
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_TRUE((*registry)->Authenticate("acme", "acme-token").ok());
  EXPECT_TRUE((*registry)->Authenticate("globex", "globex-token").ok());
  EXPECT_EQ((*registry)->tenant_count(), 2u);
}

TEST(TenantRegistryTest, ATenantWithoutTokenMatchesNoToken) {
  auto registry = TenantRegistry::Create({{"initech", Bytes()}});
  ASSERT_TRUE(registry.ok()) << registry.status();
  for (const char* token : {"", "anything"}) {
    EXPECT_EQ((*registry)->Authenticate("initech", token).code(),
              absl::StatusCode::kUnauthenticated)
        << token;
  }
  EXPECT_FALSE(TenantRegistry::Create({{"initech", Bytes(31, 1)}}).ok());
}

TEST(TenantRegistryTest, RefusesWrongTokenUnknownTenantAndSwappedTokens) {
  auto registry = TenantRegistry::Create(TwoTenants());
  ASSERT_TRUE(registry.ok());
  for (auto [tenant, token] : std::vector<std::pair<std::string, std::string>>{
           {"acme", "wrong"},
           {"acme", "globex-token"},  // another tenant's token
           {"acme", ""},
           {"nobody", "acme-token"},
           {"", "acme-token"},
           {"ACME", "acme-token"}}) {
    absl::Status status = (*registry)->Authenticate(tenant, token);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << tenant << "/" << token;
    EXPECT_EQ(status.message(), "unknown tenant or wrong API token");
  }
}

TEST(TenantRegistryTest, RefusesBadConfigs) {
  EXPECT_EQ(TenantRegistry::Create({{"a/b", TokenHash("x")}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TenantRegistry::Create({{"acme", Bytes(31, 0)}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto duplicate = TenantRegistry::Create({{"acme", TokenHash("x")}, {"acme", TokenHash("y")}});
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate.status().message().find("listed twice"), std::string::npos);
}

TEST(TenantRegistryTest, ReplaceSwapsTheWholeSetAndKeepsItOnError) {
  auto registry = TenantRegistry::Create(TwoTenants());
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->Replace({{"initech", TokenHash("initech-token")}}).ok());
  EXPECT_TRUE((*registry)->Authenticate("initech", "initech-token").ok());
  EXPECT_FALSE((*registry)->Authenticate("acme", "acme-token").ok());
  EXPECT_FALSE((*registry)->Replace({{"bad/id", TokenHash("x")}}).ok());
  EXPECT_TRUE((*registry)->Authenticate("initech", "initech-token").ok());
}

TEST(TenantRegistryTest, ReadersAlwaysSeeACompleteSnapshotWhileReplaced) {
  // Every snapshot holds globex with the same token; only acme's token alternates. A reader
  // must never miss globex, whatever swap it races with.
  auto snapshot = [](const char* acme_token) {
    return std::vector<TenantCredential>{{"acme", TokenHash(acme_token)},
                                         {"globex", TokenHash("globex-token")}};
  };
  auto registry = TenantRegistry::Create(snapshot("one"));
  ASSERT_TRUE(registry.ok());
  std::thread writer([&] {
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE((*registry)->Replace(snapshot(i % 2 ? "two" : "one")).ok());
    }
  });
  int failures = 0;
  for (int i = 0; i < 5000; ++i) {
    if (!(*registry)->Authenticate("globex", "globex-token").ok()) ++failures;
  }
  writer.join();
  EXPECT_EQ(failures, 0);
  EXPECT_TRUE((*registry)->Authenticate("acme", "two").ok());
}

class DevTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("dev-token");
    ASSERT_FALSE(dir_.empty());
  }
  std::filesystem::path dir_;
};

TEST_F(DevTokenTest, CreatesOnceAndReuses) {
  std::string path = (dir_ / "demo.token").string();
  auto first = LoadOrCreateDevToken(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  EXPECT_TRUE(HexDecode(*first).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto second = LoadOrCreateDevToken(path);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  // A fresh file gets a different random token.
  auto other = LoadOrCreateDevToken((dir_ / "other.token").string());
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*first, *other);
}

TEST_F(DevTokenTest, AcceptsTrailingNewline) {
  std::string path = (dir_ / "demo.token").string();
  std::string token(64, 'a');
  ASSERT_TRUE(WriteFileAtomic(path, token + "\n", 0600).ok());
  auto loaded = LoadOrCreateDevToken(path);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(*loaded, token);
}

TEST_F(DevTokenTest, RefusesGarbageAndOpenPermissions) {
  std::string path = (dir_ / "demo.token").string();
  ASSERT_TRUE(WriteFileAtomic(path, "not a token", 0600).ok());
  auto garbage = LoadOrCreateDevToken(path);
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find(path), std::string::npos);

  ASSERT_TRUE(WriteFileAtomic(path, std::string(64, 'b'), 0644).ok());
  auto open = LoadOrCreateDevToken(path);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);
}

}  // namespace
}  // namespace cloister::host
