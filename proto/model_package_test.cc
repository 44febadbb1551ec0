#include "proto/model_package.h"

#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::package {
namespace {

using ::testing::HasSubstr;

// Owns the bytes that a PackageMembers views.
struct Files {
  std::map<std::string, std::string> contents;
  PackageMembers Members() const {
    PackageMembers members;
    for (const auto& [name, text] : contents) members.emplace(name, AsBytes(text));
    return members;
  }
};

Files Checkpoint() {
  Files files;
  files.contents["config.json"] = R"({"architectures":["LlamaForCausalLM"]})";
  files.contents["generation_config.json"] = R"({"eos_token_id":2})";
  files.contents["tokenizer.json"] = std::string(700, 't');  // spans two blocks
  files.contents["tokenizer_config.json"] = "{}";
  files.contents["model.safetensors"] = std::string(512, 'w');  // exactly one block
  return files;
}

Files Sharded() {
  Files files;
  files.contents["config.json"] = "{}";
  files.contents["tokenizer.json"] = "{}";
  files.contents["model.safetensors.index.json"] = R"({"weight_map":{}})";
  files.contents["model-00002-of-00002.safetensors"] = "second";
  files.contents["model-00001-of-00002.safetensors"] = "first";
  return files;
}

Bytes Pack(const Files& files) {
  auto packed = PackModel(files.Members());
  EXPECT_TRUE(packed.ok()) << packed.status();
  return packed.ok() ? *packed : Bytes{};
}

std::string ReadError(const Bytes& bytes) {
  auto read = ReadModelPackage(bytes);
  EXPECT_FALSE(read.ok());
  return read.ok() ? "" : std::string(read.status().message());
}

// Recomputes a header's checksum after a test changed it, so the check under test is the one
// that refuses it rather than the checksum.
void Reseal(uint8_t* header) {
  std::memset(header + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += header[i];
  std::string text = absl::StrFormat("%06o", sum);
  std::memcpy(header + 148, text.data(), 6);
  header[154] = 0;
  header[155] = ' ';
}

void SetName(uint8_t* header, std::string_view name) {
  std::memset(header, 0, 100);
  std::memcpy(header, name.data(), name.size());
  Reseal(header);
}

TEST(ModelPackageTest, RoundTripsEveryMember) {
  Files files = Checkpoint();
  Bytes packed = Pack(files);
  // Five headers, data rounded up to blocks (tokenizer.json takes two), two zero blocks.
  EXPECT_EQ(packed.size(), 512 * (5 + (1 + 1 + 2 + 1 + 1) + 2));
  auto read = ReadModelPackage(packed);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), files.contents.size());
  for (const auto& [name, text] : files.contents) {
    ASSERT_TRUE(read->contains(name)) << name;
    EXPECT_EQ(ToString(read->at(name)), text) << name;
  }
  EXPECT_TRUE(IsModelPackage(packed));
}

TEST(ModelPackageTest, IsDeterministicAndInFixedOrder) {
  Bytes packed = Pack(Checkpoint());
  EXPECT_EQ(Pack(Checkpoint()), packed);
  // config.json first, then generation_config.json, tokenizer.json, tokenizer_config.json,
  // model.safetensors, whatever the map's (alphabetical) order.
  auto name_at = [&](size_t offset) {
    return std::string(reinterpret_cast<const char*>(packed.data() + offset));
  };
  EXPECT_EQ(name_at(0), "config.json");
  EXPECT_EQ(name_at(1024), "generation_config.json");
  EXPECT_EQ(name_at(2048), "tokenizer.json");
  EXPECT_EQ(name_at(2048 + 512 * 3), "tokenizer_config.json");
  EXPECT_EQ(name_at(2048 + 512 * 5), "model.safetensors");
  // The canonical fields: mode 0644, owner 0:0, mtime 0, ustar magic.
  EXPECT_EQ(std::memcmp(packed.data() + 100,
                        "0000644\0"
                        "0000000\0"
                        "0000000\0",
                        24),
            0);
  EXPECT_EQ(std::memcmp(packed.data() + 136, "00000000000\0", 12), 0);
  EXPECT_EQ(packed[156], '0');
  EXPECT_EQ(std::memcmp(packed.data() + 257,
                        "ustar\0"
                        "00",
                        8),
            0);
}

TEST(ModelPackageTest, ShardsGoAfterTheIndexInOrder) {
  Bytes packed = Pack(Sharded());
  auto read = ReadModelPackage(packed);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(ToString(read->at("model-00001-of-00002.safetensors")), "first");
  std::string text(reinterpret_cast<const char*>(packed.data()), packed.size());
  size_t index = text.find("model.safetensors.index.json");
  size_t first = text.find("model-00001-of-00002.safetensors");
  size_t second = text.find("model-00002-of-00002.safetensors");
  EXPECT_LT(index, first);
  EXPECT_LT(first, second);
}

TEST(ModelPackageTest, AllowsOnlyCheckpointNames) {
  for (std::string_view name :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "model.safetensors.index.json", "model.safetensors", "model-00001-of-00001.safetensors",
        "model-00003-of-00030.safetensors"}) {
    EXPECT_TRUE(IsAllowedMemberName(name)) << name;
  }
  for (std::string_view name :
       {"", "README.md", "../config.json", "sub/config.json", "model-00000-of-00002.safetensors",
        "model-00003-of-00002.safetensors", "model-1-of-2.safetensors",
        "model-0000a-of-00002.safetensors", "pytorch_model.bin", "model.gguf", "config.json "}) {
    EXPECT_FALSE(IsAllowedMemberName(name)) << name;
  }
}

TEST(ModelPackageTest, WriterRefusesWhatTheReaderWould) {
  Files extra = Checkpoint();
  extra.contents["README.md"] = "hi";
  EXPECT_THAT(PackModel(extra.Members()).status().message(), HasSubstr("'README.md'"));

  for (std::string_view required : {"config.json", "tokenizer.json", "model.safetensors"}) {
    Files missing = Checkpoint();
    missing.contents.erase(std::string(required));
    auto packed = PackModel(missing.Members());
    ASSERT_FALSE(packed.ok()) << required;
    EXPECT_THAT(packed.status().message(),
                required == "model.safetensors" ? HasSubstr("no weights") : HasSubstr(required));
  }
  Files mixed = Sharded();
  mixed.contents["model.safetensors"] = "w";
  EXPECT_THAT(PackModel(mixed.Members()).status().message(),
              HasSubstr("both 'model.safetensors' and shards"));
  Files no_index = Sharded();
  no_index.contents.erase("model.safetensors.index.json");
  EXPECT_THAT(PackModel(no_index.Members()).status().message(),
              HasSubstr("without 'model.safetensors.index.json'"));
  Files missing_shard = Sharded();
  missing_shard.contents.erase("model-00002-of-00002.safetensors");
  EXPECT_THAT(PackModel(missing_shard.Members()).status().message(), HasSubstr("1 of 2 shards"));
  Files other_set = Sharded();
  other_set.contents["model-00003-of-00003.safetensors"] = "x";
  EXPECT_THAT(PackModel(other_set.Members()).status().message(),
              HasSubstr("another set of shards"));
}

TEST(ModelPackageTest, RefusesABadChecksum) {
  Bytes packed = Pack(Checkpoint());
  packed[0] = 'C';  // "Config.json", checksum not updated
  EXPECT_EQ(ReadError(packed), "model package: member 0 'Config.json': header checksum mismatch");
}

TEST(ModelPackageTest, RefusesLinksDirectoriesAndDevices) {
  for (char typeflag : {'1', '2', '3', '4', '5', '6', 'x', 'L'}) {
    Bytes packed = Pack(Checkpoint());
    packed[156] = static_cast<uint8_t>(typeflag);
    Reseal(packed.data());
    EXPECT_THAT(ReadError(packed), HasSubstr("member 0 'config.json': is a")) << typeflag;
  }
  Bytes packed = Pack(Checkpoint());
  packed[156] = '2';
  Reseal(packed.data());
  EXPECT_EQ(ReadError(packed),
            "model package: member 0 'config.json': is a symbolic link, not a regular file");
}

TEST(ModelPackageTest, RefusesNamesOutsideTheAllowlist) {
  struct Case {
    std::string name;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"../config.json", "name has a path separator or '..'"},
           {"/etc/passwd", "name has a path separator or '..'"},
           {"a\\b", "name has a path separator or '..'"},
           {"notes.txt", "name is not a checkpoint file a package may hold"},
       }) {
    Bytes packed = Pack(Checkpoint());
    SetName(packed.data(), c.name);
    EXPECT_EQ(ReadError(packed), absl::StrCat("model package: member 0 '", c.name, "': ", c.error));
  }
  Bytes packed = Pack(Checkpoint());
  std::memcpy(packed.data(), std::string(100, 'a').data(), 100);
  Reseal(packed.data());
  EXPECT_EQ(ReadError(packed), "model package: member 0: name field is not NUL-terminated");
}

TEST(ModelPackageTest, RefusesDuplicatesAndWrongOrder) {
  Bytes packed = Pack(Checkpoint());
  // Member 1 (generation_config.json at 1024) renamed config.json: a duplicate.
  SetName(packed.data() + 1024, "config.json");
  EXPECT_EQ(ReadError(packed), "model package: member 1 'config.json': duplicate member");
  packed = Pack(Checkpoint());
  // Member 1 renamed tokenizer_config.json: member 3 is then out of order... and so is the
  // tokenizer.json after it.
  SetName(packed.data() + 1024, "tokenizer_config.json");
  EXPECT_EQ(ReadError(packed),
            "model package: member 2 'tokenizer.json': out of order (after "
            "'tokenizer_config.json')");
}

TEST(ModelPackageTest, RefusesSizesBeyondTheBuffer) {
  Bytes packed = Pack(Checkpoint());
  // config.json claims 1 GiB.
  std::memcpy(packed.data() + 124, "10000000000", 11);
  Reseal(packed.data());
  EXPECT_THAT(ReadError(packed),
              HasSubstr("member 0 'config.json': size of 1073741824 bytes runs past the end"));
  packed = Pack(Checkpoint());
  std::memcpy(packed.data() + 124, "7777777777 ", 11);  // not octal digits then a NUL
  Reseal(packed.data());
  EXPECT_THAT(ReadError(packed), HasSubstr("size field is not 11 octal digits"));
}

TEST(ModelPackageTest, RefusesNonCanonicalFields) {
  struct Case {
    size_t offset;
    std::string bytes;
    std::string field;
  };
  for (const Case& c : std::vector<Case>{{100, "0000755", "mode"},
                                         {108, "0001750", "uid"},
                                         {136, "14000000000", "mtime"},
                                         {157, "target", "linkname"},
                                         {265, "root", "uname"},
                                         {345, "dir", "prefix"}}) {
    Bytes packed = Pack(Checkpoint());
    std::memcpy(packed.data() + c.offset, c.bytes.data(), c.bytes.size());
    Reseal(packed.data());
    EXPECT_THAT(ReadError(packed), HasSubstr(absl::StrCat("member 0 'config.json': header field '",
                                                          c.field, "' is not the canonical")));
  }
  Bytes packed = Pack(Checkpoint());
  std::memcpy(packed.data() + 257, "ustar  ", 8);  // GNU tar's old magic
  Reseal(packed.data());
  EXPECT_THAT(ReadError(packed), HasSubstr("not a POSIX ustar header"));
}

TEST(ModelPackageTest, RefusesNonZeroPadding) {
  Bytes packed = Pack(Checkpoint());
  packed[512 + 100] = 'x';  // after config.json's data, in its block
  EXPECT_EQ(ReadError(packed),
            "model package: member 0 'config.json': non-zero padding after its data");
}

TEST(ModelPackageTest, RefusesMissingRequiredMembers) {
  // A package without tokenizer.json, written by hand: config.json, model.safetensors, end.
  Files files = Checkpoint();
  Bytes packed = Pack(files);
  // Drop members 1..3 (generation_config, tokenizer, tokenizer_config: seven blocks).
  packed.erase(packed.begin() + 1024, packed.begin() + 1024 + 512 * 7);
  EXPECT_EQ(ReadError(packed), "model package: required member 'tokenizer.json' is missing");
  // Weights dropped: only the JSON files.
  packed = Pack(files);
  packed.erase(packed.end() - 1024 - 1024, packed.end() - 1024);
  EXPECT_THAT(ReadError(packed), HasSubstr("no weights"));
}

TEST(ModelPackageTest, RefusesTruncationTrailingGarbageAndALoneZeroBlock) {
  Bytes packed = Pack(Checkpoint());
  Bytes trailing = packed;
  trailing.push_back(0);
  EXPECT_EQ(ReadError(trailing), "model package: 1 bytes of trailing garbage after the end marker");
  Bytes extra_zeros = packed;
  extra_zeros.resize(packed.size() + 512 * 18, 0);  // tar's 10 KiB record padding
  EXPECT_THAT(ReadError(extra_zeros), HasSubstr("trailing garbage"));
  Bytes lone = packed;
  lone.resize(packed.size() - 512);
  EXPECT_THAT(ReadError(lone), HasSubstr("a lone zero block"));
  Bytes no_end = packed;
  no_end.resize(packed.size() - 1024);
  EXPECT_THAT(ReadError(no_end), HasSubstr("member 5: truncated"));
  Bytes cut = packed;
  cut.resize(700);  // inside config.json's padding
  EXPECT_THAT(ReadError(cut), HasSubstr("member 0 'config.json': truncated in the padding"));
  EXPECT_THAT(ReadError(Bytes{}), HasSubstr("member 0: truncated"));
}

TEST(ModelPackageTest, RefusesMoreThanTheBoundedNumberOfMembers) {
  // kMaxMembers + 1 headers of config.json-like entries: refused at the bound, not after.
  Files files = Checkpoint();
  Bytes packed = Pack(files);
  Bytes many;
  Bytes header(packed.begin(), packed.begin() + 1024);  // config.json and its data block
  for (size_t i = 0; i <= kMaxMembers; ++i) {
    std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, kMaxMembers + 1);
    Bytes copy = header;
    SetName(copy.data(), name);
    many.insert(many.end(), copy.begin(), copy.end());
  }
  many.resize(many.size() + 1024, 0);
  EXPECT_THAT(ReadError(many),
              HasSubstr(absl::StrCat("member ", kMaxMembers, ": more than the ", kMaxMembers)));
  Files too_many = Sharded();
  for (size_t i = 0; i < kMaxMembers; ++i) {
    too_many.contents[absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, kMaxMembers)] = "";
  }
  EXPECT_THAT(PackModel(too_many.Members()).status().message(), HasSubstr("more than the"));
}

// The seed corpus was written by another tar implementation (Python's tarfile, ustar format,
// fields set to the canonical values): the reader takes its valid archives and refuses the rest.
TEST(ModelPackageTest, ReadsArchivesOfAnotherWriterWithTheCanonicalFields) {
  const std::string corpus = CLOISTER_MODEL_PACKAGE_CORPUS_DIR;
  for (const char* valid : {"single.tar", "sharded.tar"}) {
    auto bytes = ReadFile(corpus + "/" + valid);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto members = ReadModelPackage(AsBytes(*bytes));
    ASSERT_TRUE(members.ok()) << valid << ": " << members.status();
    EXPECT_TRUE(members->contains("config.json"));
    auto packed = PackModel(*members);
    ASSERT_TRUE(packed.ok());
    EXPECT_EQ(ToString(*packed), *bytes) << valid;
  }
  struct Case {
    const char* file;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {"symlink.tar", "member 2 'model.safetensors': is a symbolic link"},
           {"directory.tar", "member 2 'model.safetensors/': is a directory"},
           {"traversal.tar", "member 1 '../tokenizer.json': name has a path separator"},
           {"out_of_order.tar", "member 1 'config.json': out of order"},
           {"truncated.tar", "truncated"},
           {"trailing.tar", "512 bytes of trailing garbage"},
           {"missing_weights.tar", "no weights"},
       }) {
    auto bytes = ReadFile(corpus + "/" + c.file);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto members = ReadModelPackage(AsBytes(*bytes));
    ASSERT_FALSE(members.ok()) << c.file;
    EXPECT_THAT(members.status().message(), HasSubstr(c.error)) << c.file;
  }
}

TEST(ModelPackageTest, TellsPackagesFromOnnx) {
  EXPECT_TRUE(IsModelPackage(Pack(Sharded())));
  Bytes onnx(1024, 0);
  onnx[0] = 0x08;  // ModelProto.ir_version
  onnx[1] = 0x07;
  EXPECT_FALSE(IsModelPackage(onnx));
  EXPECT_FALSE(IsModelPackage(Bytes{}));
  Bytes other_first = Pack(Checkpoint());
  SetName(other_first.data(), "tokenizer.json");
  EXPECT_FALSE(IsModelPackage(other_first));
}

}  // namespace
}  // namespace cloister::package
