// The row-independence analysis (row_analysis.h) through Model::Load: graphs that keep rows
// apart pass, graphs that mix them are refused naming the node that does, and the models we
// serve pass (so their requests still coalesce). A graph refused here runs one request at a time
// in the enclave; one wrongly passed would leak rows between a tenant's requests, so the
// refusals are the cases that matter most.
#include <filesystem>

#include "base/file.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::runtime {
namespace {

using ::testing::HasSubstr;

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

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

TEST_F(SharedModels, AStatefulVoiceDetectorIsRefused) {
  // Its state input holds the batch on axis 1 and its sample rate is a scalar.
  const RowIndependence rows = AnalyzeFile("vad/silero_vad_op18_ifless.onnx");
  EXPECT_FALSE(rows.independent);
  EXPECT_FALSE(rows.reason.empty());
}

}  // namespace
}  // namespace cloister::runtime
