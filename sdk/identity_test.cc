#include "sdk/identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "crypto/keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::sdk {
namespace {

using ::testing::HasSubstr;

// RFC 8032 section 7.1, test 1.
constexpr char kSeedHex[] = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
constexpr char kPublicHex[] = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

std::string KeyText(std::string_view seed_hex = kSeedHex,
                    std::string_view public_hex = kPublicHex) {
  return absl::StrCat("CLOISTER ED25519 PRIVATE KEY\n", std::string(seed_hex),
                      "\npublic: ", std::string(public_hex), "\n");
}

void ExpectParseError(std::string_view text, std::string_view problem) {
  auto identity = TenantIdentity::Parse(text, "key.txt");
  ASSERT_FALSE(identity.ok());
  EXPECT_EQ(identity.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(identity.status().message());
  EXPECT_THAT(message, HasSubstr("key.txt: not a cloister identity key: "));
  EXPECT_THAT(message, HasSubstr(problem));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  // The seed never appears in an error message.
  EXPECT_EQ(message.find(kSeedHex), std::string::npos);
}

TEST(IdentityTest, ParsesKnownKeyAndSigns) {
  auto identity = TenantIdentity::Parse(KeyText(), "key.txt");
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->public_key_hex(), kPublicHex);
  EXPECT_EQ(identity->Format(), KeyText());
  // RFC 8032 test 1: the signature of the empty message.
  auto signature = identity->Sign({});
  ASSERT_TRUE(signature.ok()) << signature.status();
  EXPECT_EQ(HexEncode(*signature),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
            "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
}

TEST(IdentityTest, GeneratedKeysRoundTripAndDiffer) {
  TenantIdentity a = TenantIdentity::Generate();
  TenantIdentity b = TenantIdentity::Generate();
  EXPECT_NE(a.public_key(), b.public_key());
  auto parsed = TenantIdentity::Parse(a.Format(), "a.key");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->public_key(), a.public_key());
  Bytes message = ToBytes("transcript");
  auto signature = parsed->Sign(message);
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(crypto::Ed25519Verify(a.public_key(), message, *signature).ok());
  EXPECT_FALSE(crypto::Ed25519Verify(b.public_key(), message, *signature).ok());
}

TEST(IdentityTest, AcceptsCrLfAndTrailingBlankLines) {
  std::string text = absl::StrCat("CLOISTER ED25519 PRIVATE KEY\r\n", kSeedHex,
                                  "\r\npublic: ", kPublicHex, "\r\n\r\n");
  auto identity = TenantIdentity::Parse(text, "key.txt");
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->public_key_hex(), kPublicHex);
  // Upper-case hex is fine too.
  std::string upper = KeyText("9D61B19DEFFD5A60BA844AF492EC2CC44449C5697B326919703BAC031CAE7F60");
  EXPECT_TRUE(TenantIdentity::Parse(upper, "key.txt").ok());
}

TEST(IdentityTest, RejectsMalformedFiles) {
  ExpectParseError("", "the file is empty");
  ExpectParseError("\n\n", "the file is empty");
  ExpectParseError(absl::StrCat("CLOISTER X25519 PRIVATE KEY\n", kSeedHex, "\n"),
                   "the first line is not");
  ExpectParseError("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n", "the first line");
  ExpectParseError(absl::StrCat("CLOISTER ED25519 PRIVATE KEY\n", kSeedHex, "\n"),
                   "expected 3 lines");
  ExpectParseError(KeyText(std::string(kSeedHex).substr(0, 62)), "64-digit hex seed");
  ExpectParseError(KeyText(absl::StrCat(kSeedHex, "00")), "64-digit hex seed");
  std::string not_hex = kSeedHex;
  not_hex[10] = 'g';
  ExpectParseError(KeyText(not_hex), "64-digit hex seed");
  ExpectParseError(absl::StrCat("CLOISTER ED25519 PRIVATE KEY\n", kSeedHex, "\npub: ", kPublicHex),
                   "does not start with \"public: \"");
  ExpectParseError(KeyText(kSeedHex, "d75a98"), "public key is not 64 hex digits");
  std::string other_public = kPublicHex;
  other_public[0] = 'e';
  ExpectParseError(KeyText(kSeedHex, other_public), "does not match the seed");
  ExpectParseError(absl::StrCat(KeyText(), "extra\n"), "unexpected text after");
}

TEST(IdentityTest, FromSeedChecksSize) {
  EXPECT_EQ(TenantIdentity::FromSeed(Bytes(31)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto identity = TenantIdentity::FromSeed(*HexDecode(kSeedHex));
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->public_key_hex(), kPublicHex);
}

class IdentityFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("identity-test");
    ASSERT_FALSE(dir_.empty());
  }
  int Mode(const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_mode & 07777;
  }
  std::string dir_;
};

TEST_F(IdentityFileTest, SavesWithMode0600AndLoads) {
  std::string path = dir_ + "/tenant.key";
  mode_t old_umask = ::umask(0);  // the file must still be 0600 under a permissive umask
  TenantIdentity identity = TenantIdentity::Generate();
  absl::Status saved = identity.Save(path);
  ::umask(old_umask);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(Mode(path), 0600);
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, identity.Format());
  auto loaded = TenantIdentity::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->public_key(), identity.public_key());
}

TEST_F(IdentityFileTest, RefusesToOverwrite) {
  std::string path = dir_ + "/tenant.key";
  TenantIdentity first = TenantIdentity::Generate();
  ASSERT_TRUE(first.Save(path).ok());
  TenantIdentity second = TenantIdentity::Generate();
  absl::Status status = second.Save(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(status.message()), HasSubstr("refusing to overwrite"));
  auto loaded = TenantIdentity::Load(path);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->public_key(), first.public_key());
}

TEST_F(IdentityFileTest, SaveIntoMissingDirectoryFails) {
  absl::Status status = TenantIdentity::Generate().Save(dir_ + "/no/such/dir/tenant.key");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot create"));
}

TEST_F(IdentityFileTest, RefusesGroupOrWorldAccessibleFiles) {
  std::string path = dir_ + "/tenant.key";
  ASSERT_TRUE(TenantIdentity::Generate().Save(path).ok());
  for (int mode : {0640, 0604, 0660, 0644, 0602, 0620}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto loaded = TenantIdentity::Load(path);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("chmod 600"));
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(TenantIdentity::Load(path).ok());
}

TEST_F(IdentityFileTest, ReportsMissingFilesSymlinksAndGarbage) {
  auto missing = TenantIdentity::Load(dir_ + "/missing.key");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cloister keygen"));

  std::string path = dir_ + "/tenant.key";
  ASSERT_TRUE(TenantIdentity::Generate().Save(path).ok());
  std::string link = dir_ + "/link.key";
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_EQ(TenantIdentity::Load(link).status().code(), absl::StatusCode::kFailedPrecondition);

  std::string garbage = dir_ + "/garbage.key";
  ASSERT_TRUE(WriteFileAtomic(garbage, "hello\n", 0600).ok());
  auto loaded = TenantIdentity::Load(garbage);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(garbage));

  EXPECT_EQ(TenantIdentity::Load(dir_).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cloister::sdk
