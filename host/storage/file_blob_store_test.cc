#include "host/storage/file_blob_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "base/bytes.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

namespace fs = std::filesystem;

constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";
constexpr char kOtherHandle[] = "fedcba9876543210fedcba9876543210";

class FileBlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(cloister::testing::MakeTempDir("blob-store")) / "store";
    auto store = FileBlobStore::Open(root_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Files in the tenant's folder, by name.
  std::vector<std::string> FilesOf(const std::string& tenant) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root_ / tenant, ec)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  void StoreModel(const std::string& tenant, const std::string& handle,
                  const std::string& ciphertext, const std::string& key) {
    auto upload = store_->BeginUpload(tenant, handle);
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->Append(ciphertext).ok());
    ASSERT_TRUE((*upload)->Commit(key).ok());
  }

  fs::path root_;
  std::unique_ptr<FileBlobStore> store_;
};

TEST_F(FileBlobStoreTest, UploadCommitListRead) {
  auto upload = store_->BeginUpload("acme", kHandle);
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Append("hello ").ok());
  ASSERT_TRUE((*upload)->Append("").ok());
  ASSERT_TRUE((*upload)->Append("world").ok());
  EXPECT_EQ((*upload)->size(), 11u);
  auto all = (*upload)->ReadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, "hello world");
  // Not listed before the commit.
  auto before = store_->List();
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(before->empty());

  ASSERT_TRUE((*upload)->Commit("wrapped-key").ok());
  upload->reset();
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const StoredModel& model = (*listed)[0];
  EXPECT_EQ(model.tenant_id, "acme");
  EXPECT_EQ(model.handle, kHandle);
  EXPECT_EQ(model.ciphertext_size, 11u);
  EXPECT_EQ(model.ciphertext_sha256, HexEncode(crypto::Sha256(AsBytes("hello world"))));
  EXPECT_LT(absl::Now() - model.stored_at, absl::Minutes(1));

  EXPECT_EQ(*store_->ReadCiphertext("acme", kHandle), "hello world");
  EXPECT_EQ(*store_->ReadWrappedKey("acme", kHandle), "wrapped-key");
  std::string stem = std::string(kHandle);
  EXPECT_EQ(FilesOf("acme"),
            (std::vector<std::string>{stem + ".blob", stem + ".key", stem + ".meta"}));
  struct stat st;
  ASSERT_EQ(::stat((root_ / "acme" / (stem + ".blob")).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  ASSERT_EQ(::stat((root_ / "acme").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700);
}

TEST_F(FileBlobStoreTest, DroppedUploadLeavesNothing) {
  {
    auto upload = store_->BeginUpload("acme", kHandle);
    ASSERT_TRUE(upload.ok());
    ASSERT_TRUE((*upload)->Append("partial").ok());
    EXPECT_EQ(FilesOf("acme").size(), 1u);  // the staging file
  }
  EXPECT_TRUE(FilesOf("acme").empty());
  EXPECT_TRUE(store_->List()->empty());
  EXPECT_EQ(store_->ReadCiphertext("acme", kHandle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FileBlobStoreTest, RefusesBadNames) {
  EXPECT_EQ(store_->BeginUpload("..", kHandle).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->BeginUpload("acme", "../../etc/passwd").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->BeginUpload("acme", "0123456789ABCDEF0123456789ABCDEF").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Delete("a/b", kHandle).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileBlobStoreTest, CommitRefusesEmptyKeyAndCleansUp) {
  auto upload = store_->BeginUpload("acme", kHandle);
  ASSERT_TRUE(upload.ok());
  ASSERT_TRUE((*upload)->Append("data").ok());
  EXPECT_EQ((*upload)->Commit("").code(), absl::StatusCode::kInvalidArgument);
  upload->reset();
  EXPECT_TRUE(FilesOf("acme").empty());
}

TEST_F(FileBlobStoreTest, ReplaceAndDelete) {
  StoreModel("acme", kHandle, "first", "key1");
  StoreModel("acme", kHandle, "second version", "key2");
  StoreModel("acme", kOtherHandle, "other", "key3");
  StoreModel("globex", kHandle, "globex copy", "key4");
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].tenant_id, "acme");
  EXPECT_EQ((*listed)[0].handle, kHandle);
  EXPECT_EQ((*listed)[0].ciphertext_size, 14u);
  EXPECT_EQ((*listed)[1].handle, kOtherHandle);
  EXPECT_EQ((*listed)[2].tenant_id, "globex");
  EXPECT_EQ(*store_->ReadWrappedKey("acme", kHandle), "key2");

  ASSERT_TRUE(store_->Delete("acme", kHandle).ok());
  ASSERT_TRUE(store_->Delete("acme", kHandle).ok());  // idempotent
  listed = store_->List();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].handle, kOtherHandle);
  EXPECT_EQ(store_->ReadWrappedKey("acme", kHandle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FilesOf("acme").size(), 3u);
}

TEST_F(FileBlobStoreTest, ListSkipsIncompleteAndCorruptEntries) {
  StoreModel("acme", kHandle, "model bytes", "key");
  StoreModel("acme", kOtherHandle, "other bytes", "key");
  std::string stem = (root_ / "acme" / kHandle).string();
  std::string other = (root_ / "acme" / kOtherHandle).string();
  // Truncated blob: size no longer matches the metadata.
  ASSERT_TRUE(WriteFileAtomic(stem + ".blob", "short").ok());
  // Missing key file.
  fs::remove(other + ".key");
  // Garbage metadata under a third handle, and a stray file.
  ASSERT_TRUE(
      WriteFileAtomic((root_ / "acme" / "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.meta").string(), ": :")
          .ok());
  ASSERT_TRUE(WriteFileAtomic((root_ / "acme" / "notes.meta").string(), "x").ok());
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

TEST_F(FileBlobStoreTest, MetadataForAnotherTenantIsSkipped) {
  StoreModel("acme", kHandle, "model", "key");
  fs::create_directories(root_ / "globex");
  for (const char* ext : {".blob", ".key", ".meta"}) {
    fs::copy_file(root_ / "acme" / (std::string(kHandle) + ext),
                  root_ / "globex" / (std::string(kHandle) + ext));
  }
  auto listed = store_->List();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].tenant_id, "acme");
}

TEST_F(FileBlobStoreTest, OpenRemovesStaleStagingFiles) {
  StoreModel("acme", kHandle, "kept", "key");
  {
    auto upload = store_->BeginUpload("acme", kOtherHandle);
    ASSERT_TRUE(upload.ok());
    ASSERT_TRUE((*upload)->Append("abandoned").ok());
    // Simulate a crash: the staging file outlives the process.
    for (const auto& entry : fs::directory_iterator(root_ / "acme")) {
      if (entry.path().string().find(".tmp") != std::string::npos) {
        fs::copy_file(entry.path(), entry.path().string() + "-copy");
      }
    }
  }
  ASSERT_EQ(FilesOf("acme").size(), 4u);
  auto reopened = FileBlobStore::Open(root_.string());
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(FilesOf("acme").size(), 3u);
  EXPECT_EQ((*reopened)->List()->size(), 1u);
}

}  // namespace
}  // namespace cloister::host
