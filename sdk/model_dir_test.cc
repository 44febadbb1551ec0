#include "sdk/model_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/model_package.h"
#include "tests/support/temp_dir.h"

namespace cloister::sdk {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kLimit = uint64_t{1} << 20;

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("model-dir-test");
    ASSERT_FALSE(dir_.empty());
  }
  void Write(const std::string& name, const std::string& text) {
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + name, text, 0644).ok()) << name;
  }
  void WriteCheckpoint() {
    Write("config.json", R"({"architectures":["LlamaForCausalLM"]})");
    Write("tokenizer.json", "{}");
    Write("tokenizer_config.json", "{}");
    Write("model.safetensors", "weights");
  }
  std::string dir_;
};

TEST_F(ModelDirTest, PacksOnlyTheCheckpointFiles) {
  WriteCheckpoint();
  Write("README.md", "# a model");
  Write("model.gguf", "other weights");
  Write("pytorch_model.bin", "pickles");
  ASSERT_EQ(::mkdir((dir_ + "/original").c_str(), 0755), 0);  // subfolders are not looked into
  auto packed = PackModelDir(dir_, kLimit);
  ASSERT_TRUE(packed.ok()) << packed.status();
  auto members = package::ReadModelPackage(*packed);
  ASSERT_TRUE(members.ok()) << members.status();
  std::vector<std::string> names;
  for (const auto& [name, bytes] : *members) names.push_back(name);
  EXPECT_THAT(names, ::testing::ElementsAre("config.json", "model.safetensors", "tokenizer.json",
                                            "tokenizer_config.json"));
  EXPECT_EQ(ToString(members->at("model.safetensors")), "weights");
  // The same folder packs to the same bytes (the digest is stable), and a trailing slash does
  // not matter.
  auto again = PackModelDir(dir_ + "/", kLimit);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *packed);
}

TEST_F(ModelDirTest, RefusesSymbolicLinks) {
  WriteCheckpoint();
  Write("elsewhere.bin", "secret");
  ASSERT_EQ(::unlink((dir_ + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink((dir_ + "/elsewhere.bin").c_str(), (dir_ + "/model.safetensors").c_str()), 0);
  auto packed = PackModelDir(dir_, kLimit);
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().message(),
            dir_ +
                "/model.safetensors is a symbolic link: copy the file itself into the folder "
                "(links are not followed)");
  EXPECT_FALSE(ListModelDir(dir_).ok());
}

TEST_F(ModelDirTest, RefusesACheckpointNameThatIsNotAFile) {
  WriteCheckpoint();
  ASSERT_EQ(::mkdir((dir_ + "/generation_config.json").c_str(), 0755), 0);
  EXPECT_EQ(ListModelDir(dir_).status().message(),
            dir_ + "/generation_config.json is not a regular file");
}

TEST_F(ModelDirTest, RefusesAFolderWithoutTheRequiredFiles) {
  EXPECT_THAT(ListModelDir(dir_).status().message(),
              HasSubstr("model folder " + dir_ + " has no config.json (a checkpoint folder holds"));
  Write("config.json", "{}");
  EXPECT_THAT(ListModelDir(dir_).status().message(), HasSubstr("has no tokenizer.json"));
  Write("tokenizer.json", "{}");
  EXPECT_THAT(ListModelDir(dir_).status().message(), HasSubstr("has no safetensors weights"));
  Write("model-00001-of-00002.safetensors", "a");
  // Shards without their index and the other shard: what PackModel refuses, with the folder.
  auto packed = PackModelDir(dir_, kLimit);
  EXPECT_THAT(packed.status().message(),
              HasSubstr("model folder " + dir_ + ": model package: shards"));
  EXPECT_THAT(ListModelDir(dir_ + "/missing").status().message(),
              HasSubstr("cannot read model folder " + dir_ + "/missing"));
}

TEST_F(ModelDirTest, RefusesAFolderOverTheLimit) {
  WriteCheckpoint();
  Write("model.safetensors", std::string(2000, 'w'));
  EXPECT_THAT(PackModelDir(dir_, 1000).status().message(),
              HasSubstr("bytes of checkpoint files, over the limit of 1000"));
  // Under the limit in files, over it once packed (headers and padding).
  EXPECT_THAT(PackModelDir(dir_, 2100).status().message(), HasSubstr("packs to"));
}

}  // namespace
}  // namespace cloister::sdk
