// Intra-op threads for the kernels beyond convolutions: a model loaded with two threads splits
// its elementwise, pooling, normalisation and batched-product loops into ranges on them
// (parallel.h) and must give what one thread gives, to the bit where the arithmetic per
// element is the same.
#include <cstdint>
#include <string>
#include <vector>

#include "enclave/runtime/broadcast.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/runtime_test_helpers.h"
#include "gtest/gtest.h"

namespace cloister::runtime {
namespace {

// Every row of the layout once, in order, whichever ranges the rows are walked in.
TEST(BroadcastRowsTest, RangesTogetherWalkEveryRowOnce) {
  const std::vector<std::vector<int64_t>> a_shapes = {{3, 1, 5, 7}, {4, 6}, {1}, {2, 3, 1}};
  const std::vector<std::vector<int64_t>> b_shapes = {{1, 4, 1, 7}, {6}, {9}, {2, 1, 8}};
  for (size_t c = 0; c < a_shapes.size(); ++c) {
    auto out = BroadcastShapes(a_shapes[c], b_shapes[c]);
    ASSERT_TRUE(out.ok());
    auto layout = MakeBroadcastLayout<2>(*out, {&a_shapes[c], &b_shapes[c]});
    std::vector<std::array<int64_t, 3>> whole, pieces;
    ForEachBroadcastRow(layout, [&](int64_t o, int64_t, const std::array<int64_t, 2>& off,
                                    const std::array<int64_t, 2>&) {
      whole.push_back({o, off[0], off[1]});
    });
    const int64_t rows = BroadcastRows(layout);
    ASSERT_EQ(static_cast<int64_t>(whole.size()), rows) << "case " << c;
    for (int64_t first = 0; first < rows; first += 2) {
      ForEachBroadcastRowIn(layout, first, std::min(rows, first + 2),
                            [&](int64_t o, int64_t, const std::array<int64_t, 2>& off,
                                const std::array<int64_t, 2>&) {
                              pieces.push_back({o, off[0], off[1]});
                            });
    }
    EXPECT_EQ(pieces, whole) << "case " << c;
  }
}

// The graph at one thread and at two on float inputs made from a fixed seed: the same, exactly
// or within `tolerance` where a product's parts may round apart.
void ExpectSameWithTwoThreads(const GraphBuilder& builder,
                              const std::vector<std::pair<std::string, std::vector<int64_t>>>& in,
                              float tolerance = 0.0f) {
  std::vector<std::pair<std::string, Tensor>> inputs;
  uint32_t seed = 7;
  for (const auto& [name, shape] : in) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    inputs.emplace_back(name, FloatTensor(shape, RandomFloats(count, seed++)));
  }
  ExpectSameWithOneAndTwoThreads(builder.Bytes(), inputs, tolerance);
}

TEST(ParallelKernelsTest, ElementwiseWithAndWithoutBroadcast) {
  GraphBuilder builder;
  builder.Input("a", onnx::TensorProto::FLOAT, {4, 64, 33, 17});
  builder.Input("b", onnx::TensorProto::FLOAT, {64, 1, 1});
  builder.Input("c", onnx::TensorProto::FLOAT, {4, 64, 33, 17});
  builder.Node("Add", {"a", "b"}, {"sum"});
  builder.Node("Mul", {"sum", "c"}, {"product"});
  builder.Node("Less", {"product", "b"}, {"less"});
  builder.Output("product");
  builder.Output("less", onnx::TensorProto::BOOL);
  ExpectSameWithTwoThreads(builder, {{"a", {4, 64, 33, 17}}, {"b", {64, 1, 1}},
                                     {"c", {4, 64, 33, 17}}});
}

TEST(ParallelKernelsTest, WhereOverAnAttentionMask) {
  GraphBuilder builder;
  builder.Input("scores", onnx::TensorProto::FLOAT, {2, 4, 128, 128});
  builder.Input("mask", onnx::TensorProto::FLOAT, {2, 1, 1, 128});
  builder.FloatInitializer("zero", {}, {0.0f});
  builder.FloatInitializer("low", {}, {-1e4f});
  builder.Node("Less", {"mask", "zero"}, {"masked"});
  builder.Node("Where", {"masked", "low", "scores"}, {"kept"});
  // A condition as wide as the output, and one value as wide as the output too.
  builder.Node("Less", {"scores", "zero"}, {"negative"});
  builder.Node("Where", {"negative", "scores", "low"}, {"clipped"});
  builder.Output("kept");
  builder.Output("clipped");
  ExpectSameWithTwoThreads(builder, {{"scores", {2, 4, 128, 128}}, {"mask", {2, 1, 1, 128}}});
}

TEST(ParallelKernelsTest, SoftmaxAndLayerNormalization) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 4, 128, 128});
  builder.Input("h", onnx::TensorProto::FLOAT, {300, 256});
  builder.FloatInitializer("scale", {256}, RandomFloats(256, 1));
  builder.FloatInitializer("bias", {256}, RandomFloats(256, 2));
  builder.Node("Softmax", {"x"}, {"p"});
  builder.Node("LayerNormalization", {"h", "scale", "bias"}, {"n"});
  builder.Output("p");
  builder.Output("n");
  ExpectSameWithTwoThreads(builder, {{"x", {2, 4, 128, 128}}, {"h", {300, 256}}});
}

TEST(ParallelKernelsTest, TransposesOfAttentionHeads) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 128, 4, 64});
  SetInts(builder.Node("Transpose", {"x"}, {"heads"}), "perm", {0, 2, 1, 3});
  SetInts(builder.Node("Transpose", {"x"}, {"keys"}), "perm", {0, 2, 3, 1});
  builder.Node("Transpose", {"x"}, {"reversed"});
  builder.Output("heads");
  builder.Output("keys");
  builder.Output("reversed");
  ExpectSameWithTwoThreads(builder, {{"x", {2, 128, 4, 64}}});
}

TEST(ParallelKernelsTest, ReductionsOverMiddleAxes) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {8, 128, 256});
  builder.Input("y", onnx::TensorProto::FLOAT, {4, 8, 16, 32});
  builder.IntInitializer("tokens", {1}, {1});
  builder.Node("ReduceSum", {"x", "tokens"}, {"pooled"});
  SetInts(builder.Node("ReduceMax", {"y"}, {"peak"}), "axes", {1, 2});
  builder.Output("pooled");
  builder.Output("peak");
  ExpectSameWithTwoThreads(builder, {{"x", {8, 128, 256}}, {"y", {4, 8, 16, 32}}});
}

TEST(ParallelKernelsTest, Pools) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {4, 16, 48, 96});
  auto& max = builder.Node("MaxPool", {"x"}, {"max"});
  SetInts(max, "kernel_shape", {3, 3});
  SetInts(max, "strides", {2, 2});
  SetInts(max, "pads", {1, 1, 1, 1});
  auto& dilated = builder.Node("MaxPool", {"x"}, {"dilated"});
  SetInts(dilated, "kernel_shape", {3, 3});
  SetInts(dilated, "dilations", {2, 2});
  builder.Node("GlobalAveragePool", {"x"}, {"mean"});
  builder.Output("max");
  builder.Output("dilated");
  builder.Output("mean");
  ExpectSameWithTwoThreads(builder, {{"x", {4, 16, 48, 96}}});
}

TEST(ParallelKernelsTest, MatMulWithFusedBiasAndGeluAndBatchedProducts) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 128, 256});
  builder.FloatInitializer("w", {256, 512}, RandomFloats(256 * 512, 3));
  builder.FloatInitializer("b", {512}, RandomFloats(512, 4));
  builder.Node("MatMul", {"x", "w"}, {"xw"});
  builder.Node("Add", {"xw", "b"}, {"xwb"});
  AddWrittenOutGelu(builder, "xwb", "hidden");  // fused at load into the product
  builder.Input("q", onnx::TensorProto::FLOAT, {2, 4, 128, 64});
  builder.Input("k", onnx::TensorProto::FLOAT, {2, 4, 64, 128});
  builder.Node("MatMul", {"q", "k"}, {"scores"});
  builder.Output("hidden");
  builder.Output("scores");
  ExpectSameWithTwoThreads(
      builder, {{"x", {2, 128, 256}}, {"q", {2, 4, 128, 64}}, {"k", {2, 4, 64, 128}}}, 1e-6f);
}

}  // namespace
}  // namespace cloister::runtime
