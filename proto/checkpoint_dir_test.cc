#include "proto/checkpoint_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::package {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

constexpr char kNeeds[] =
    " (a checkpoint folder holds config.json, tokenizer.json and model.safetensors (or its shards "
    "with model.safetensors.index.json))";
constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("checkpoint_dir_test");
    ASSERT_FALSE(dir_.empty());
  }
  void Write(const std::string& name, const std::string& text) {
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + name, text, 0644).ok()) << name;
  }
  void WriteRequired() {
    Write("config.json", R"({"architectures":["LlamaForCausalLM"]})");
    Write("tokenizer.json", "{}");
  }
  void WriteIndex(const std::string& weight_map) {
    Write("model.safetensors.index.json", R"({"metadata":{},"weight_map":)" + weight_map + "}");
  }
  std::string Refusal() { return std::string(ListCheckpointDir(dir_).status().message()); }
  std::string dir_;
};

TEST_F(CheckpointDirTest, ListsOnlyTheCheckpointFiles) {
  WriteRequired();
  Write("generation_config.json", "{}");
  Write("tokenizer_config.json", "{}");
  Write("model.safetensors", "weights");
  Write("README.md", "# a model");
  Write("model.gguf", "other weights");
  Write("pytorch_model.bin", "pickles");
  ASSERT_EQ(::mkdir((dir_ + "/original").c_str(), 0755), 0);  // subfolders are not looked into
  auto files = ListCheckpointDir(dir_);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(Pair("config.json", dir_ + "/config.json"),
                                  Pair("generation_config.json", dir_ + "/generation_config.json"),
                                  Pair("model.safetensors", dir_ + "/model.safetensors"),
                                  Pair("tokenizer.json", dir_ + "/tokenizer.json"),
                                  Pair("tokenizer_config.json", dir_ + "/tokenizer_config.json")));
  // A trailing slash gives the same paths.
  auto again = ListCheckpointDir(dir_ + "/");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *files);
}

TEST_F(CheckpointDirTest, ListsTheShardsOfTheIndex) {
  WriteRequired();
  // Several tensors per shard; each shard is listed once.
  WriteIndex(std::string(R"({"a":")") + kShard1 + R"(","b":")" + kShard2 + R"(","c":")" + kShard1 +
             R"("})");
  Write(kShard1, "one");
  Write(kShard2, "two");
  auto files = ListCheckpointDir(dir_);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(
      *files,
      ElementsAre(Pair("config.json", dir_ + "/config.json"), Pair(kShard1, dir_ + "/" + kShard1),
                  Pair(kShard2, dir_ + "/" + kShard2),
                  Pair("model.safetensors.index.json", dir_ + "/model.safetensors.index.json"),
                  Pair("tokenizer.json", dir_ + "/tokenizer.json")));
  // A shard the index names and the folder lacks.
  ASSERT_EQ(::unlink((dir_ + "/" + kShard2).c_str()), 0);
  EXPECT_EQ(Refusal(), "model folder " + dir_ + " has no " + kShard2 +
                           ", a shard model.safetensors.index.json names");
}

TEST_F(CheckpointDirTest, ListsShardsWithoutAnIndexForThePackerToRefuse) {
  // Whether the files go together is PackModel's or the loader's call, not the listing's.
  WriteRequired();
  Write(kShard1, "one");
  auto files = ListCheckpointDir(dir_);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->contains(kShard1));
}

TEST_F(CheckpointDirTest, RefusesAnIndexNamingAShardOutsideTheFolder) {
  WriteRequired();
  Write(kShard1, "one");
  const std::string index = dir_ + "/model.safetensors.index.json";
  WriteIndex(std::string(R"({"a":"../)") + kShard1 + R"("})");
  EXPECT_EQ(Refusal(), index + " names a shard outside the folder: ../" + kShard1);
  WriteIndex(R"({"a":"/etc/passwd"})");
  EXPECT_EQ(Refusal(), index + " names a shard outside the folder: /etc/passwd");
  WriteIndex(std::string(R"({"a":"sub/)") + kShard1 + R"("})");
  EXPECT_EQ(Refusal(), index + " names a shard outside the folder: sub/" + kShard1);
}

TEST_F(CheckpointDirTest, RefusesAnIndexThatIsNotOne) {
  WriteRequired();
  Write(kShard1, "one");
  const std::string index = dir_ + "/model.safetensors.index.json";
  Write("model.safetensors.index.json", "{\"weight_map\":");
  EXPECT_EQ(Refusal(), index + " is not valid JSON");
  Write("model.safetensors.index.json", "[]");
  EXPECT_EQ(Refusal(), index + " has no \"weight_map\" object (tensor name -> shard file)");
  WriteIndex("[]");
  EXPECT_EQ(Refusal(), index + " has no \"weight_map\" object (tensor name -> shard file)");
  WriteIndex(R"({"lm_head.weight":7})");
  EXPECT_EQ(Refusal(), index + ": the weight_map entry of 'lm_head.weight' is not a file name");
  // Names that are not shards: another format, the single-file name, a checkpoint file.
  WriteIndex(R"({"a":"pytorch_model-00001-of-00002.bin"})");
  EXPECT_EQ(Refusal(), index +
                           " names 'pytorch_model-00001-of-00002.bin', which is not a shard name "
                           "(model-NNNNN-of-MMMMM.safetensors)");
  WriteIndex(R"({"a":"model.safetensors"})");
  EXPECT_THAT(Refusal(), HasSubstr("names 'model.safetensors', which is not a shard name"));
  WriteIndex(R"({"a":"config.json"})");
  EXPECT_THAT(Refusal(), HasSubstr("names 'config.json', which is not a shard name"));
  // A name with a line break stays one line.
  WriteIndex(R"({"a":"x\ny"})");
  EXPECT_EQ(Refusal(), index +
                           " names 'x\\ny', which is not a shard name "
                           "(model-NNNNN-of-MMMMM.safetensors)");
}

TEST_F(CheckpointDirTest, RefusesSymbolicLinks) {
  WriteRequired();
  Write("elsewhere.bin", "secret");
  ASSERT_EQ(::symlink((dir_ + "/elsewhere.bin").c_str(), (dir_ + "/model.safetensors").c_str()), 0);
  EXPECT_EQ(Refusal(), dir_ +
                           "/model.safetensors is a symbolic link: copy the file itself into the "
                           "folder (links are not followed)");
  // A link to a folder, and a dangling one, are refused the same way.
  ASSERT_EQ(::unlink((dir_ + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink(dir_.c_str(), (dir_ + "/model.safetensors").c_str()), 0);
  EXPECT_THAT(Refusal(), HasSubstr("/model.safetensors is a symbolic link"));
  ASSERT_EQ(::unlink((dir_ + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink((dir_ + "/none").c_str(), (dir_ + "/model.safetensors").c_str()), 0);
  EXPECT_THAT(Refusal(), HasSubstr("/model.safetensors is a symbolic link"));
}

TEST_F(CheckpointDirTest, RefusesACheckpointNameThatIsNotAFile) {
  WriteRequired();
  Write("model.safetensors", "weights");
  ASSERT_EQ(::mkdir((dir_ + "/generation_config.json").c_str(), 0755), 0);
  EXPECT_EQ(Refusal(), dir_ + "/generation_config.json is not a regular file");
}

TEST_F(CheckpointDirTest, RefusesAFolderWithoutTheRequiredFiles) {
  EXPECT_EQ(Refusal(), "model folder " + dir_ + " has no config.json" + kNeeds);
  Write("config.json", "{}");
  EXPECT_EQ(Refusal(), "model folder " + dir_ + " has no tokenizer.json" + kNeeds);
  Write("tokenizer.json", "{}");
  EXPECT_EQ(Refusal(), "model folder " + dir_ + " has no safetensors weights" + kNeeds);
  // An index naming no shards is no weights either.
  WriteIndex("{}");
  EXPECT_EQ(Refusal(), "model folder " + dir_ + " has no safetensors weights" + kNeeds);
  Write("model.safetensors", "w");
  EXPECT_TRUE(ListCheckpointDir(dir_).ok());

  EXPECT_THAT(std::string(ListCheckpointDir(dir_ + "/missing").status().message()),
              StartsWith("cannot read model folder " + dir_ +
                         "/missing: No such file or directory (a checkpoint folder holds"));
  EXPECT_THAT(std::string(ListCheckpointDir(dir_ + "/config.json").status().message()),
              StartsWith("cannot read model folder " + dir_ + "/config.json: Not a directory"));
}

TEST_F(CheckpointDirTest, ReadsAFileWholeWithoutFollowingLinks) {
  Write("config.json", "{\"a\":1}");
  auto read = ReadCheckpointFile(dir_ + "/config.json", 100);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "{\"a\":1}");
  Write("empty.json", "");
  read = ReadCheckpointFile(dir_ + "/empty.json", 100);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");

  absl::Status over = ReadCheckpointFile(dir_ + "/config.json", 6).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message(), dir_ + "/config.json holds 7 bytes, over the limit of 6");

  ASSERT_EQ(::symlink((dir_ + "/config.json").c_str(), (dir_ + "/link.json").c_str()), 0);
  absl::Status link = ReadCheckpointFile(dir_ + "/link.json", 100).status();
  EXPECT_EQ(link.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(link.message(), dir_ +
                                "/link.json is a symbolic link: copy the file itself into the "
                                "folder (links are not followed)");

  absl::Status folder = ReadCheckpointFile(dir_, 100).status();
  EXPECT_EQ(folder.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(folder.message(), dir_ + " is not a regular file");

  absl::Status missing = ReadCheckpointFile(dir_ + "/none", 100).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(missing.message(), "cannot open " + dir_ + "/none: No such file or directory");
}

}  // namespace
}  // namespace cloister::package
