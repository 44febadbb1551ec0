// The row-independence analysis (row_analysis.h) through Model::Load: graphs that keep rows
// apart pass, graphs that mix them are refused naming the node that does, and the models we
// serve pass (so their requests still coalesce). A graph refused here runs one request at a time
// in the enclave; one wrongly passed would leak rows between a tenant's requests, so the
// refusals are the cases that matter most.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::runtime {
namespace {

using ::testing::HasSubstr;

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

// The tensor's rows in reverse order, floating-point values scaled by 1.5 (integers kept: they
// are often indices with a valid range).
Tensor OtherRows(const Tensor& tensor) {
  Tensor other = tensor.Clone();
  const int64_t rows = tensor.dim(0);
  const size_t row_size = rows == 0 ? 0 : tensor.size() / rows;
  const auto* source = static_cast<const uint8_t*>(tensor.raw_data());
  auto* target = static_cast<uint8_t*>(other.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(target + (rows - 1 - r) * row_size, source + r * row_size, row_size);
  }
  if (other.dtype() == DataType::kFloat) {
    for (int64_t i = 0; i < other.count(); ++i) other.data<float>()[i] *= 1.5f;
  } else if (other.dtype() == DataType::kDouble) {
    for (int64_t i = 0; i < other.count(); ++i) other.data<double>()[i] *= 1.5;
  }
  return other;
}

Tensor Concatenated(const Tensor& a, const Tensor& b) {
  std::vector<int64_t> shape = a.shape();
  shape[0] += b.dim(0);
  Tensor joined = *Tensor::Create(a.dtype(), shape);
  std::memcpy(joined.raw_data(), a.raw_data(), a.size());
  std::memcpy(static_cast<uint8_t*>(joined.raw_data()) + a.size(), b.raw_data(), b.size());
  return joined;
}

// "" when `got` holds `want` to `tolerance` relative and absolute (NaN matching NaN).
template <typename T>
std::string CompareFloats(const T* got, const T* want, int64_t count, T tolerance) {
  for (int64_t i = 0; i < count; ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && !(std::fabs(got[i] - want[i]) <= tolerance + tolerance * std::fabs(want[i]))) {
      return absl::StrCat("element ", i, ": ", got[i], " against ", want[i]);
    }
  }
  return "";
}

// "" when `joined` rows [offset, offset + part rows) equal `part` (floats to 1e-5 relative).
std::string CompareRows(const Tensor& joined, const Tensor& part, int64_t offset) {
  if (joined.rank() != part.rank() || joined.dtype() != part.dtype()) return "rank or type";
  for (int i = 1; i < part.rank(); ++i) {
    if (joined.dim(i) != part.dim(i)) return "shape";
  }
  const size_t row_size = part.dim(0) == 0 ? 0 : part.size() / part.dim(0);
  const auto* got = static_cast<const uint8_t*>(joined.raw_data()) + offset * row_size;
  if (part.dtype() == DataType::kFloat) {
    return CompareFloats(reinterpret_cast<const float*>(got), part.data<float>(), part.count(),
                         1e-5f);
  }
  if (part.dtype() == DataType::kDouble) {
    return CompareFloats(reinterpret_cast<const double*>(got), part.data<double>(), part.count(),
                         1e-9);
  }
  return std::memcmp(got, part.raw_data(), part.size()) == 0 ? "" : "bytes differ";
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Runs `model` on `first`, on `second` and on both concatenated along axis 0 (the same inputs
// in the same order). The separate runs' error when one fails; otherwise "" when the joint run
// gives each set exactly its own rows, or what differs.
absl::StatusOr<std::string> RowsApartAndTogether(const Model& model, const NamedTensors& first,
                                                 const NamedTensors& second) {
  ASSIGN_OR_RETURN(NamedTensors alone, model.Run(first));
  ASSIGN_OR_RETURN(NamedTensors other, model.Run(second));
  NamedTensors joined;
  for (size_t i = 0; i < first.size(); ++i) {
    joined.emplace_back(first[i].first, Concatenated(first[i].second, second[i].second));
  }
  auto together = model.Run(joined);
  if (!together.ok()) return absl::StrCat("the joint run failed: ", together.status().message());
  for (size_t o = 0; o < alone.size(); ++o) {
    const Tensor& got = (*together)[o].second;
    const Tensor& a = alone[o].second;
    const Tensor& b = other[o].second;
    if (a.rank() == 0) return absl::StrCat("output ", o, " has no rows");
    if (got.dim(0) != a.dim(0) + b.dim(0)) {
      return absl::StrCat("output ", o, " has ", got.dim(0), " rows, not ", a.dim(0) + b.dim(0));
    }
    if (std::string diff = CompareRows(got, a, 0); !diff.empty()) {
      return absl::StrCat("output ", o, " (first): ", diff);
    }
    if (std::string diff = CompareRows(got, b, a.dim(0)); !diff.empty()) {
      return absl::StrCat("output ", o, " (second): ", diff);
    }
  }
  return "";
}

// Input `index` of a test data set folder (input_K.pb, a serialized onnx.TensorProto).
absl::StatusOr<Tensor> ReadInputFile(const std::filesystem::path& set, size_t index) {
  ASSIGN_OR_RETURN(std::string data,
                   ReadFile((set / absl::StrCat("input_", index, ".pb")).string()));
  onnx::TensorProto proto;
  if (!proto.ParseFromString(data)) {
    return absl::InvalidArgumentError(absl::StrCat("input_", index, ".pb is not a TensorProto"));
  }
  return TensorFromProto(proto);
}

RowIndependence Analyze(const GraphBuilder& builder) {
  const std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {false, "did not load"};
  return (*model)->row_independence();
}

// x [n, 4] -> MatMul w [4, 3] -> Add b [3] -> Relu -> Softmax(axis) -> y.
GraphBuilder Classifier(int64_t softmax_axis, int opset = 17) {
  GraphBuilder builder(opset);
  builder.Input("x", kFloat, {-1, 4})
      .FloatInitializer("w", {4, 3}, std::vector<float>(12, 0.5f))
      .FloatInitializer("b", {3}, {1, 2, 3});
  builder.Node("MatMul", {"x", "w"}, {"h"});
  builder.Node("Add", {"h", "b"}, {"hb"});
  builder.Node("Relu", {"hb"}, {"r"});
  SetInt(builder.Node("Softmax", {"r"}, {"y"}, "probs"), "axis", softmax_axis);
  builder.Output("y");
  return builder;
}

TEST(RowIndependence, ADenseClassifierKeepsRowsApart) {
  const RowIndependence rows = Analyze(Classifier(1));
  EXPECT_TRUE(rows.independent) << rows.reason;
  EXPECT_TRUE(Analyze(Classifier(-1)).independent);
}

TEST(RowIndependence, ASoftmaxOverTheRowsMixesThem) {
  const RowIndependence rows = Analyze(Classifier(0));
  EXPECT_FALSE(rows.independent);
  EXPECT_EQ(rows.reason, "node 'probs' (Softmax) normalizes over the row axis");
}

TEST(RowIndependence, AnOldSoftmaxFlattensFromItsAxis) {
  // Before opset 13, Softmax(axis=0) normalizes over the whole tensor, rows included.
  EXPECT_FALSE(Analyze(Classifier(0, 11)).independent);
  EXPECT_TRUE(Analyze(Classifier(1, 11)).independent);
}

GraphBuilder Reduction(std::vector<int64_t> axes, int64_t keepdims) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  auto& reduce = builder.Node("ReduceMean", {"x"}, {"m"}, "mean");
  SetInts(reduce, "axes", std::move(axes));
  SetInt(reduce, "keepdims", keepdims);
  builder.Node("Sub", {"x", "m"}, {"y"});
  builder.Output("y");
  return builder;
}

TEST(RowIndependence, ReductionsOverTheRowAxisMixRows) {
  // x - mean over the batch: what a normalisation with batch statistics does.
  const RowIndependence rows = Analyze(Reduction({0}, 1));
  EXPECT_FALSE(rows.independent);
  EXPECT_EQ(rows.reason, "node 'mean' (ReduceMean) reduces over the row axis");
  EXPECT_TRUE(Analyze(Reduction({1}, 1)).independent);
  EXPECT_TRUE(Analyze(Reduction({-1}, 1)).independent);
}

TEST(RowIndependence, AReductionWithoutKeepdimsMovesTheAxesAfterIt) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 3, 4});
  auto& reduce = builder.Node("ReduceSum", {"x", "axes"}, {"y"});
  builder.IntInitializer("axes", {1}, {1});
  SetInt(reduce, "keepdims", 0);
  builder.Output("y");
  EXPECT_TRUE(Analyze(builder).independent);
}

TEST(RowIndependence, AnOutputWithRowsOnAnotherAxisIsRefused) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  SetInts(builder.Node("Transpose", {"x"}, {"y"}), "perm", {1, 0});
  builder.Output("y");
  EXPECT_EQ(Analyze(builder).reason, "output 'y' holds its rows on axis 1");
}

TEST(RowIndependence, AProductOverTheRowsMixesThem) {
  // x^T x: a Gram matrix over the batch.
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  SetInts(builder.Node("Transpose", {"x"}, {"t"}), "perm", {1, 0});
  builder.Node("MatMul", {"t", "x"}, {"y"}, "gram");
  builder.Output("y");
  EXPECT_EQ(Analyze(builder).reason, "node 'gram' (MatMul) contracts over the row axis");
}

TEST(RowIndependence, AttentionShapedReshapesFollowTheRowCount) {
  // As BERT exports build them: the reshape target concatenates Shape(x)[0], Shape(x)[1] and
  // constants; then heads are moved next to the rows and multiplied batch-wise.
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, -1, 8})
      .IntInitializer("zero", {}, {0})
      .IntInitializer("one", {}, {1})
      .IntInitializer("heads", {2}, {2, 4})
      .IntInitializer("axis0", {1}, {0});
  builder.Node("Shape", {"x"}, {"s"});
  builder.Node("Gather", {"s", "zero"}, {"n"});
  builder.Node("Gather", {"s", "one"}, {"seq"});
  builder.Node("Unsqueeze", {"n", "axis0"}, {"n1"});
  builder.Node("Unsqueeze", {"seq", "axis0"}, {"seq1"});
  SetInt(builder.Node("Concat", {"n1", "seq1", "heads"}, {"target"}), "axis", 0);
  builder.Node("Reshape", {"x", "target"}, {"split"});
  SetInts(builder.Node("Transpose", {"split"}, {"q"}), "perm", {0, 2, 1, 3});
  SetInts(builder.Node("Transpose", {"split"}, {"k"}), "perm", {0, 2, 3, 1});
  builder.Node("MatMul", {"q", "k"}, {"scores"});
  SetInt(builder.Node("Softmax", {"scores"}, {"y"}), "axis", -1);
  builder.Output("y");
  const RowIndependence rows = Analyze(builder);
  EXPECT_TRUE(rows.independent) << rows.reason;
}

GraphBuilder ReshapeTo(std::vector<int64_t> target) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 8})
      .IntInitializer("target", {static_cast<int64_t>(target.size())}, target);
  builder.Node("Reshape", {"x", "target"}, {"y"}, "fold");
  builder.Output("y");
  return builder;
}

TEST(RowIndependence, ReshapesKeepRowsOnlyWhenEachRowKeepsItsSize) {
  EXPECT_TRUE(Analyze(ReshapeTo({-1, 2, 4})).independent);
  EXPECT_TRUE(Analyze(ReshapeTo({0, 4, 2})).independent);
  // [-1, 4] makes two rows of each: the output has twice the rows.
  EXPECT_EQ(Analyze(ReshapeTo({-1, 4})).reason, "node 'fold' (Reshape) reshapes the row axis");
  // [1, -1] puts every row into one.
  EXPECT_EQ(Analyze(ReshapeTo({1, -1})).reason, "node 'fold' (Reshape) reshapes the row axis");
}

// Shape of a value whose rank only the analysis knows (an Expand to a computed shape, which
// inference leaves unranked): its dimensions other than the rows are "same", unknown values.
TEST(RowIndependence, TheShapeOfAValueInferenceLeftUnrankedIsFollowed) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  builder.Node("Shape", {"x"}, {"s"});
  builder.Node("Expand", {"x", "s"}, {"e"});
  builder.Node("Shape", {"e"}, {"es"});
  builder.Node("Reshape", {"e", "es"}, {"y"});
  builder.Output("y");
  const RowIndependence rows = Analyze(builder);
  EXPECT_TRUE(rows.independent) << rows.reason;
}

TEST(RowIndependence, AnEmbeddingLookupIndexedByRowsKeepsThem) {
  GraphBuilder builder;
  builder.Input("ids", kInt64, {-1, -1})
      .FloatInitializer("table", {10, 4}, std::vector<float>(40, 0.25f));
  builder.Node("Gather", {"table", "ids"}, {"y"});
  builder.Output("y");
  EXPECT_TRUE(Analyze(builder).independent);
}

TEST(RowIndependence, ConcatenatingAlongTheRowsMixesThem) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  SetInt(builder.Node("Concat", {"x", "x"}, {"y"}, "twice"), "axis", 0);
  builder.Output("y");
  EXPECT_EQ(Analyze(builder).reason, "node 'twice' (Concat) concatenates along the row axis");
}

TEST(RowIndependence, MaxPoolIndicesCountEarlierRows) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 1, 4, 4});
  auto& pool = builder.Node("MaxPool", {"x"}, {"y", "where"}, "pool");
  SetInts(pool, "kernel_shape", {2, 2});
  builder.Output("y");
  EXPECT_TRUE(Analyze(builder).independent);
  builder.Output("where");
  EXPECT_EQ(Analyze(builder).reason, "node 'pool' (MaxPool) output 1 depends on the other rows");
}

TEST(RowIndependence, AConstantOutputHasNoRows) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4}).FloatInitializer("c", {2}, {1, 2});
  builder.Node("Relu", {"x"}, {"y"});
  builder.Node("Identity", {"c"}, {"z"});
  builder.Output("y").Output("z");
  EXPECT_EQ(Analyze(builder).reason, "output 'z' does not depend on the input rows");
}

TEST(RowIndependence, AnOperatorWithoutARuleIsRefused) {
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4});
  builder.Node("NonZero", {"x"}, {"y"}, "where");
  builder.Output("y");
  EXPECT_THAT(Analyze(builder).reason, HasSubstr("node 'where' (NonZero) has no rule for rows"));
}

TEST(RowIndependence, AConstantBroadcastAlongTheRowsIsRefused) {
  // b [2, 4] added to x [n, 4] only works when n is 2, and then adds a different row of b to
  // each row: coalescing would change which row of b a request's row gets.
  GraphBuilder builder;
  builder.Input("x", kFloat, {-1, 4}).FloatInitializer("b", {2, 4}, std::vector<float>(8, 1));
  builder.Node("Add", {"x", "b"}, {"y"}, "add");
  builder.Output("y");
  EXPECT_EQ(Analyze(builder).reason, "node 'add' (Add) broadcasts a value along the row axis");
}

// x [n, 5, 2] -> Transpose to [5, n, 2] -> LSTM (hidden 3, constant weights) -> Y [5, 1, n, 3]
// and Y_h [1, n, 3], transposed back to rows first: the rows pass through the layer's batch
// axis, and running requests together gives each its own rows.
TEST(RowIndependence, AnLstmRunsEachRowsSequenceAlone) {
  GraphBuilder builder(14);
  builder.Input("x", kFloat, {-1, 5, 2})
      .FloatInitializer("w", {1, 12, 2}, RandomFloats(24, 1))
      .FloatInitializer("r", {1, 12, 3}, RandomFloats(36, 2));
  SetInts(builder.Node("Transpose", {"x"}, {"xt"}), "perm", {1, 0, 2});
  SetInt(builder.Node("LSTM", {"xt", "w", "r"}, {"y", "y_h"}, "lstm"), "hidden_size", 3);
  SetInts(builder.Node("Transpose", {"y"}, {"out"}), "perm", {2, 0, 1, 3});
  SetInts(builder.Node("Transpose", {"y_h"}, {"state"}), "perm", {1, 0, 2});
  builder.Output("out").Output("state");
  const std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->row_independence().independent) << (*model)->row_independence().reason;

  auto rows = RowsApartAndTogether(
      **model, {{"x", *Tensor::FromVector<float>({2, 5, 2}, RandomFloats(20, 3))}},
      {{"x", *Tensor::FromVector<float>({3, 5, 2}, RandomFloats(30, 4))}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, "");

  // The same layer fed rows on its sequence axis mixes them.
  GraphBuilder mixing(14);
  mixing.Input("x", kFloat, {-1, 5, 2})
      .FloatInitializer("w", {1, 12, 2}, RandomFloats(24, 1))
      .FloatInitializer("r", {1, 12, 3}, RandomFloats(36, 2));
  SetInt(mixing.Node("LSTM", {"x", "w", "r"}, {"y", "y_h"}, "lstm"), "hidden_size", 3);
  mixing.Output("y_h");
  EXPECT_EQ(Analyze(mixing).reason,
            "node 'lstm' (LSTM) runs its sequences over an axis that is not the rows");
}

// The models the appliance serves: their requests must keep coalescing.
std::string ModelPath(const std::string& relative) {
  return (std::filesystem::path(CLOISTER_MODELS_DIR) / relative).string();
}

RowIndependence AnalyzeFile(const std::string& relative) {
  auto bytes = ReadFile(ModelPath(relative));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto model = Model::Load(AsBytes(*bytes));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->row_independence() : RowIndependence{};
}

class SharedModels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(CLOISTER_MODELS_DIR)) {
      GTEST_SKIP() << "no shared models at " << CLOISTER_MODELS_DIR;
    }
  }
};

TEST_F(SharedModels, TheServedModelsKeepRowsApart) {
  for (const char* path : {"ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                           "ocr/ch_PP-OCRv4_rec_infer.onnx", "bert_mini/bert_mini_l4_h256.onnx"}) {
    const RowIndependence rows = AnalyzeFile(path);
    EXPECT_TRUE(rows.independent) << path << ": " << rows.reason;
  }
}

// The served models on their reference inputs and on a second request (floats scaled, BERT's
// token ids shifted): run together, each request gets exactly the rows it gets alone.
TEST_F(SharedModels, TheServedModelsGiveEachRequestItsOwnRowsWhenRunTogether) {
  for (const auto& [path, data] :
       {std::pair{"ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx", "ch_ppocr_mobile_v2.0_cls"},
        std::pair{"ocr/ch_PP-OCRv4_rec_infer.onnx", "ch_PP-OCRv4_rec"},
        std::pair{"bert_mini/bert_mini_l4_h256.onnx", "bert_mini_l4_h256"}}) {
    auto bytes = ReadFile(ModelPath(path));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto model = Model::Load(AsBytes(*bytes));
    ASSERT_TRUE(model.ok()) << model.status();
    NamedTensors first, second;
    for (size_t i = 0; i < (*model)->inputs().size(); ++i) {
      auto tensor =
          ReadInputFile(ModelPath(absl::StrCat("testdata/", data, "/test_data_set_0")), i);
      ASSERT_TRUE(tensor.ok()) << tensor.status();
      const std::string& name = (*model)->inputs()[i].name;
      Tensor other = OtherRows(*tensor);
      if (name == "input_ids") {
        for (int64_t k = 0; k < other.count(); ++k) {
          other.data<int64_t>()[k] = 1000 + (other.data<int64_t>()[k] * 7) % 1000;
        }
      }
      first.emplace_back(name, *tensor);
      second.emplace_back(name, other);
    }
    auto rows = RowsApartAndTogether(**model, first, second);
    ASSERT_TRUE(rows.ok()) << path << ": " << rows.status();
    EXPECT_EQ(*rows, "") << path;
  }
}

TEST_F(SharedModels, AStatefulVoiceDetectorIsRefused) {
  // Its state input holds the batch on axis 1 and its sample rate is a scalar.
  const RowIndependence rows = AnalyzeFile("vad/silero_vad_op18_ifless.onnx");
  EXPECT_FALSE(rows.independent);
  EXPECT_FALSE(rows.reason.empty());
}

// Soundness against the operators' own semantics: every ONNX conformance model the analysis
// passes (node tests and PyTorch exports) is run on its test inputs, on a second input set (the
// floating-point values scaled by 1.5, rows reversed), and on both concatenated along axis 0.
// The concatenated run must give exactly the two separate runs' rows, as coalescing assumes.
class ConformanceSoundness : public ::testing::Test {
 protected:
  static std::vector<std::filesystem::path> TestFolders() {
    std::vector<std::filesystem::path> folders;
    const std::filesystem::path data(CLOISTER_ONNX_TESTDATA);
    for (const auto& [list, suite] :
         {std::pair{"node_tests.txt", "node"},
          std::pair{"pytorch_converted_tests.txt", "pytorch-converted"},
          std::pair{"pytorch_operator_tests.txt", "pytorch-operator"}}) {
      auto text = ReadFile((std::filesystem::path(CLOISTER_RUNTIME_SOURCE_DIR) / list).string());
      if (!text.ok()) continue;
      for (absl::string_view line : absl::StrSplit(*text, '\n')) {
        if (absl::StartsWith(line, "test_")) folders.push_back(data / suite / std::string(line));
      }
    }
    return folders;
  }
};

// The model with axis 0 of its inputs and outputs made dynamic (the conformance models fix every
// dimension), and without intermediate shape declarations that would fix it again.
std::string WithDynamicRows(const std::string& bytes) {
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes)) return bytes;
  auto* graph = model.mutable_graph();
  graph->clear_value_info();
  std::unordered_set<std::string> initializers;
  for (const auto& initializer : graph->initializer()) initializers.insert(initializer.name());
  auto relax = [](onnx::ValueInfoProto& value) {
    auto* shape = value.mutable_type()->mutable_tensor_type()->mutable_shape();
    if (shape->dim_size() > 0) shape->mutable_dim(0)->set_dim_param("rows");
  };
  for (auto& input : *graph->mutable_input()) {
    if (!initializers.count(input.name())) relax(input);
  }
  for (auto& output : *graph->mutable_output()) relax(output);
  return model.SerializeAsString();
}

TEST_F(ConformanceSoundness, PassedModelsGiveEachRequestItsOwnRows) {
  const std::vector<std::filesystem::path> folders = TestFolders();
  if (folders.empty() || !std::filesystem::exists(folders[0])) {
    GTEST_SKIP() << "no ONNX conformance data under " << CLOISTER_ONNX_TESTDATA;
  }
  int passed = 0, checked = 0;
  for (const std::filesystem::path& folder : folders) {
    auto bytes = ReadFile((folder / "model.onnx").string());
    if (!bytes.ok()) continue;
    const std::string dynamic = WithDynamicRows(*bytes);
    auto model = Model::Load(AsBytes(dynamic));
    if (!model.ok() || !(*model)->row_independence().independent) continue;
    ++passed;
    // The first test set's inputs, by name.
    NamedTensors first, second;
    bool usable = true;
    for (size_t i = 0; i < (*model)->inputs().size() && usable; ++i) {
      auto tensor = ReadInputFile(folder / "test_data_set_0", i);
      usable = tensor.ok() && tensor->rank() > 0 && tensor->dim(0) > 0 &&
               (first.empty() || tensor->dim(0) == first[0].second.dim(0));
      if (!usable) break;
      const std::string& name = (*model)->inputs()[i].name;
      first.emplace_back(name, *tensor);
      second.emplace_back(name, OtherRows(*tensor));
    }
    if (!usable || first.empty()) continue;  // no rows to put together, as RunBatch decides
    auto rows = RowsApartAndTogether(**model, first, second);
    if (!rows.ok()) continue;  // the scaled inputs left the operator's domain
    ++checked;
    EXPECT_EQ(*rows, "") << folder.filename();
  }
  std::printf("%zu conformance models: %d keep rows apart, %d of those checked coalesced\n",
              folders.size(), passed, checked);
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace cloister::runtime
