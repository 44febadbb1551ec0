#include "bench/runtime_vs_ort.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/file.h"
#include "base/status.h"
#include "enclave/runtime/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using runtime::DataType;
using runtime::Tensor;
using ::testing::HasSubstr;

const std::pair<std::string, Tensor>* Find(
    const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& name) {
  for (const auto& entry : tensors) {
    if (entry.first == name) return &entry;
  }
  return nullptr;
}

TEST(SummarizeTest, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(Summarize({3, 1, 2}).median_ms, 2);
  EXPECT_DOUBLE_EQ(Summarize({4, 1, 3, 2}).median_ms, 2.5);
  EXPECT_DOUBLE_EQ(Summarize({7}).median_ms, 7);
  EXPECT_EQ(Summarize({4, 1, 3, 2}).count, 4);
}

TEST(SummarizeTest, P90IsNearestRank) {
  // Ten samples: the 9th smallest has 90% at or below it.
  EXPECT_DOUBLE_EQ(Summarize({10, 9, 8, 7, 6, 5, 4, 3, 2, 1}).p90_ms, 9);
  // Two samples: rank ceil(1.8) = 2.
  EXPECT_DOUBLE_EQ(Summarize({1, 5}).p90_ms, 5);
  EXPECT_DOUBLE_EQ(Summarize({7}).p90_ms, 7);
}

TEST(MakeInputsTest, ShapesFollowTheBatch) {
  for (int batch : {1, 8}) {
    auto cls = MakeInputs("cls", batch, 1);
    ASSERT_TRUE(cls.ok()) << cls.status();
    ASSERT_EQ(cls->size(), 1u);
    EXPECT_EQ((*cls)[0].second.shape(), (std::vector<int64_t>{batch, 3, 48, 192}));

    auto rec = MakeInputs("rec", batch, 1);
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ((*rec)[0].second.shape(), (std::vector<int64_t>{batch, 3, 48, 320}));

    auto vad = MakeInputs("vad", batch, 1);
    ASSERT_TRUE(vad.ok()) << vad.status();
    ASSERT_NE(Find(*vad, "input"), nullptr);
    EXPECT_EQ(Find(*vad, "input")->second.shape(), (std::vector<int64_t>{batch, 576}));
    EXPECT_EQ(Find(*vad, "state")->second.shape(), (std::vector<int64_t>{2, batch, 128}));
    const Tensor& sample_rate = Find(*vad, "sr")->second;
    EXPECT_EQ(sample_rate.rank(), 0);
    EXPECT_EQ(sample_rate.data<int64_t>()[0], 16000);

    auto bert = MakeInputs("bert_mini", batch, 1);
    ASSERT_TRUE(bert.ok()) << bert.status();
    for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) {
      ASSERT_NE(Find(*bert, name), nullptr) << name;
      EXPECT_EQ(Find(*bert, name)->second.shape(), (std::vector<int64_t>{batch, 128})) << name;
    }
  }
}

TEST(MakeInputsTest, ValuesAreSeededAndInRange) {
  auto first = MakeInputs("cls", 1, 42);
  auto again = MakeInputs("cls", 1, 42);
  auto other = MakeInputs("cls", 1, 43);
  ASSERT_TRUE(first.ok() && again.ok() && other.ok());
  const Tensor& a = (*first)[0].second;
  const Tensor& b = (*again)[0].second;
  const Tensor& c = (*other)[0].second;
  int differing = 0;
  float lowest = 1, highest = -1;
  for (int64_t i = 0; i < a.count(); ++i) {
    ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]);
    differing += a.data<float>()[i] != c.data<float>()[i];
    lowest = std::min(lowest, a.data<float>()[i]);
    highest = std::max(highest, a.data<float>()[i]);
  }
  EXPECT_GT(differing, a.count() / 2);
  EXPECT_GE(lowest, -1.0f);
  EXPECT_LT(highest, 1.0f);
  EXPECT_LT(lowest, -0.99f);  // the whole range is used
  EXPECT_GT(highest, 0.99f);

  auto bert = MakeInputs("bert_mini", 8, 42);
  ASSERT_TRUE(bert.ok());
  const Tensor& ids = Find(*bert, "input_ids")->second;
  int64_t max_id = 0;
  for (int64_t i = 0; i < ids.count(); ++i) {
    ASSERT_GE(ids.data<int64_t>()[i], 0);
    max_id = std::max(max_id, ids.data<int64_t>()[i]);
  }
  EXPECT_LT(max_id, 8192);
  EXPECT_GT(max_id, 8000);
  const Tensor& mask = Find(*bert, "attention_mask")->second;
  for (int64_t i = 0; i < mask.count(); ++i) ASSERT_EQ(mask.data<int64_t>()[i], 1);
}

TEST(MakeInputsTest, RefusesUnknownModelAndEmptyBatch) {
  EXPECT_EQ(MakeInputs("resnet", 1, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MakeInputs("cls", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The inputs made here are exactly the inputs each shared model declares.
TEST(MakeInputsTest, MatchTheModelsDeclaredInputs) {
  for (const BenchModel& bench_model : BenchModels()) {
    auto bytes = ReadFile((fs::path(CLOISTER_SHARED_DIR) / "models" / bench_model.file).string());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto model = runtime::Model::Load(AsBytes(*bytes));
    ASSERT_TRUE(model.ok()) << bench_model.name << ": " << model.status();
    auto inputs = MakeInputs(bench_model.name, 8, 1);
    ASSERT_TRUE(inputs.ok());
    ASSERT_EQ(inputs->size(), (*model)->inputs().size()) << bench_model.name;
    for (const runtime::TensorSpec& spec : (*model)->inputs()) {
      const auto* input = Find(*inputs, spec.name);
      ASSERT_NE(input, nullptr) << bench_model.name << " input " << spec.name;
      EXPECT_EQ(input->second.dtype(), spec.dtype) << spec.name;
      ASSERT_EQ(input->second.rank(), static_cast<int>(spec.shape.size())) << spec.name;
      for (size_t axis = 0; axis < spec.shape.size(); ++axis) {
        if (spec.shape[axis] >= 0) {
          EXPECT_EQ(input->second.dim(axis), spec.shape[axis]) << spec.name << " axis " << axis;
        }
      }
    }
  }
}

std::vector<std::pair<std::string, Tensor>> OneOutput(const std::string& name,
                                                      std::vector<float> values) {
  auto tensor = Tensor::FromVector<float>({static_cast<int64_t>(values.size())}, values);
  CLOISTER_CHECK(tensor.ok());
  return {{name, *tensor}};
}

TEST(MaxAbsDiffTest, MeasuresTheLargestDifference) {
  auto same = MaxAbsDiff(OneOutput("y", {1, 2, 3}), OneOutput("y", {1, 2, 3}));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, 0);
  auto differs = MaxAbsDiff(OneOutput("y", {1, 2, 3}), OneOutput("y", {1, 2.5, 2}));
  ASSERT_TRUE(differs.ok());
  EXPECT_DOUBLE_EQ(*differs, 1);
  auto nan = MaxAbsDiff(OneOutput("y", {1, NAN}), OneOutput("y", {1, 2}));
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(std::isnan(*nan));
}

TEST(MaxAbsDiffTest, RefusesMismatchedOutputs) {
  EXPECT_THAT(MaxAbsDiff(OneOutput("y", {1}), OneOutput("z", {1})).status().message(),
              HasSubstr("no output named y"));
  EXPECT_THAT(MaxAbsDiff(OneOutput("y", {1, 2}), OneOutput("y", {1})).status().message(),
              HasSubstr("output y"));
  EXPECT_EQ(MaxAbsDiff(OneOutput("y", {1}), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

ComparisonResult Result(const std::string& model, int batch, double ours, double ort) {
  ComparisonResult result;
  result.model = model;
  result.batch = batch;
  result.threads = 2;
  result.ours = Summarize({ours, ours * 1.1});
  result.ort = Summarize({ort, ort * 1.1});
  result.max_abs_diff = 1e-6;
  return result;
}

TEST(ReportTest, JsonLineHasTheRequiredFields) {
  const std::string line = JsonLine(Result("rec", 8, 30, 20));
  EXPECT_EQ(line.find('\n'), std::string::npos);
  nlohmann::json object = nlohmann::json::parse(line);
  EXPECT_EQ(object["model"], "rec");
  EXPECT_EQ(object["batch"], 8);
  EXPECT_NEAR(object["ours_ms"].get<double>(), 31.5, 1e-9);
  EXPECT_NEAR(object["ort_ms"].get<double>(), 21, 1e-9);
  EXPECT_NEAR(object["ratio"].get<double>(), 1.5, 1e-4);
  EXPECT_EQ(object["threads"], 2);
  EXPECT_EQ(object["iterations"], 2);
  EXPECT_TRUE(object.contains("ours_p90_ms"));
  EXPECT_TRUE(object.contains("ort_p90_ms"));
}

TEST(ReportTest, TableNamesTheSlowerLines) {
  const std::string table = FormatTable({Result("cls", 1, 1.0, 1.0), Result("rec", 8, 30, 20)});
  EXPECT_THAT(table, HasSubstr("ours ms"));
  EXPECT_THAT(table, HasSubstr("1 of 2 within ratio 1.25; slower: rec b8 (1.50)"));
  EXPECT_THAT(FormatTable({Result("cls", 1, 1.0, 1.0)}), HasSubstr("1 of 1 within ratio 1.25\n"));
}

TEST(FlagsTest, ParsesValuesInBothSpellings) {
  RuntimeVsOrtOptions defaults;
  defaults.threads = 7;
  auto options = ParseRuntimeVsOrtFlags(
      {"--json", "--iterations", "4", "--threads=2", "--model", "vad", "--batches", "1,4",
       "--ort-dir", "/x/node_modules", "--seed=9", "--profile"},
      defaults);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->json);
  EXPECT_TRUE(options->profile);
  EXPECT_EQ(options->iterations, 4);
  EXPECT_EQ(options->threads, 2);
  EXPECT_EQ(options->model, "vad");
  EXPECT_EQ(options->batches, (std::vector<int>{1, 4}));
  EXPECT_EQ(options->ort_dir, "/x/node_modules");
  EXPECT_EQ(options->seed, 9u);

  auto untouched = ParseRuntimeVsOrtFlags({}, defaults);
  ASSERT_TRUE(untouched.ok());
  EXPECT_EQ(untouched->threads, 7);
  EXPECT_EQ(untouched->batches, (std::vector<int>{1, 8}));
}

TEST(FlagsTest, RefusesBadFlags) {
  auto message = [](std::vector<std::string> args) {
    return std::string(ParseRuntimeVsOrtFlags(args, {}).status().message());
  };
  EXPECT_THAT(message({"--threads", "0"}), HasSubstr("--threads needs an integer >= 1"));
  EXPECT_THAT(message({"--iterations", "many"}), HasSubstr("--iterations"));
  EXPECT_THAT(message({"--iterations"}), HasSubstr("--iterations needs a value"));
  EXPECT_THAT(message({"--model", "resnet"}), HasSubstr("no model named \"resnet\""));
  EXPECT_THAT(message({"--batches", "1,,8"}), HasSubstr("--batches"));
  EXPECT_THAT(message({"--json=yes"}), HasSubstr("--json takes no value"));
  EXPECT_THAT(message({"--fast"}), HasSubstr("unknown flag --fast"));
}

class PeerStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("ort-peer-test");
    ASSERT_FALSE(dir_.empty());
  }
  fs::path dir_;
};

TEST_F(PeerStartTest, MissingPackageIsAFailedPrecondition) {
  auto peer = OrtPeer::Start({.script = CLOISTER_BENCH_PEER_SCRIPT, .modules_dir = dir_});
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(peer.status().message(), HasSubstr("onnxruntime-node not found"));
}

TEST_F(PeerStartTest, MissingNodeIsAFailedPrecondition) {
  fs::create_directories(dir_ / "node_modules" / "onnxruntime-node");
  auto peer = OrtPeer::Start({.node = (dir_ / "no-such-node").string(),
                              .script = CLOISTER_BENCH_PEER_SCRIPT,
                              .modules_dir = dir_.string()});
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(peer.status().message(), HasSubstr("cannot start"));
}

// A package that fails to load: with node installed the peer reports it in its greeting;
// without node, starting fails. Either way the peer counts as not installed.
TEST_F(PeerStartTest, BrokenPackageIsAFailedPrecondition) {
  const fs::path package = dir_ / "onnxruntime-node";
  fs::create_directories(package);
  std::ofstream(package / "package.json") << R"({"name":"onnxruntime-node","version":"0.0.0"})";
  std::ofstream(package / "index.js") << "throw new Error('no native binding here');\n";
  auto peer = OrtPeer::Start({.script = CLOISTER_BENCH_PEER_SCRIPT, .modules_dir = dir_});
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cloister::bench
