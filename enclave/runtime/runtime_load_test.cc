// Load-time validation tests for the enclave's inference runtime: unsupported, malformed and
// oversized models are refused with an error that names what is wrong.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"
#include "enclave/runtime/runtime_test_helpers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Load-time refusals name the node and operator.

TEST(LoadTest, UnsupportedOperatorNamesNodeAndOp) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Relu", {"x"}, {"r"}, "first");
  builder.Node("FancyOp", {"r"}, {"y"}, "fancy_node");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("fancy_node"));
  EXPECT_THAT(status.message(), HasSubstr("FancyOp"));
}

TEST(LoadTest, UnsupportedTypeNamesNodeAndOp) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::INT64, {1, 1, 4, 4});
  builder.IntInitializer("w", {1, 1, 1, 1}, {1});
  builder.Node("Conv", {"x", "w"}, {"y"}, "int_conv");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("int_conv"));
  EXPECT_THAT(status.message(), HasSubstr("(Conv)"));
  EXPECT_THAT(status.message(), HasSubstr("INT64"));
}

// Cast's `to` names the element type by its ONNX code; STRING, unknown codes and codes past the
// int range (which must not wrap onto a valid one) are refused.
TEST(LoadTest, CastToUnsupportedTypeRefused) {
  for (int64_t to : {int64_t{onnx::TensorProto::STRING}, int64_t{99},
                     (int64_t{1} << 32) + onnx::TensorProto::FLOAT}) {
    GraphBuilder builder(13);
    builder.Input("x", onnx::TensorProto::FLOAT, {2});
    SetInt(builder.Node("Cast", {"x"}, {"y"}, "bad_cast"), "to", to);
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << to << ": " << status;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("cast to element type ", to, " is not supported")));
  }
}

TEST(LoadTest, NonDefaultDomainRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Gelu", {"x"}, {"y"}, "ms_gelu").set_domain("com.microsoft");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("ms_gelu"));
  EXPECT_THAT(status.message(), HasSubstr("com.microsoft"));
}

TEST(LoadTest, MissingInputRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Add", {"x", "nowhere"}, {"y"}, "adder");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("adder"));
  EXPECT_THAT(status.message(), HasSubstr("nowhere"));
}

TEST(LoadTest, CycleRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Add", {"x", "b"}, {"a"}, "node_a");
  builder.Node("Relu", {"a"}, {"b"}, "node_b");
  builder.Output("b");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("cycle"));
}

TEST(LoadTest, DuplicateOutputRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Relu", {"x"}, {"y"}, "one");
  builder.Node("Neg", {"x"}, {"y"}, "two");
  builder.Output("y");
  EXPECT_THAT(LoadError(builder).message(), HasSubstr("already defined"));
}

TEST(LoadTest, ExternalDataRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  auto* tensor = builder.proto().mutable_graph()->add_initializer();
  tensor->set_name("w");
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  tensor->add_dims(2);
  tensor->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = tensor->add_external_data();
  entry->set_key("location");
  entry->set_value("/etc/passwd");
  builder.Node("Add", {"x", "w"}, {"y"});
  builder.Output("y");
  EXPECT_THAT(LoadError(builder).message(), HasSubstr("external data"));
}

TEST(LoadTest, BadInitializerAndShapesRefused) {
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {2});
    builder.FloatInitializer("w", {3}, {1, 2});  // 2 values for 3 elements
    builder.Node("Add", {"x", "w"}, {"y"});
    builder.Output("y");
    EXPECT_THAT(LoadError(builder).message(), HasSubstr("'w'"));
  }
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {2, 6});
    builder.IntInitializer("shape", {2}, {5, -1});
    builder.Node("Reshape", {"x", "shape"}, {"y"}, "reshaper");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_THAT(status.message(), HasSubstr("reshaper"));
    EXPECT_THAT(status.message(), HasSubstr("cannot reshape"));
  }
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {2, 3});
    builder.Node("Relu", {"x"}, {"y"});
    builder.Output("y", onnx::TensorProto::FLOAT, std::vector<int64_t>{2, 4});
    EXPECT_THAT(LoadError(builder).message(), HasSubstr("declared with shape"));
  }
}

TEST(LoadTest, GarbageAndOversizedRefused) {
  std::string garbage = "this is not a protobuf \xff\xff\xff";
  EXPECT_FALSE(Model::Load(AsBytes(garbage)).ok());
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Relu", {"x"}, {"y"});
  builder.Output("y");
  std::string bytes = builder.Bytes();
  LoadOptions options;
  options.max_model_size = 10;
  EXPECT_THAT(Model::Load(AsBytes(bytes), options).status().message(), HasSubstr("limit"));
}

TEST(LoadTest, OpsetTooNewOrOperatorTooOldRefused) {
  GraphBuilder newer(30);
  newer.Input("x", onnx::TensorProto::FLOAT, {2});
  newer.Node("Relu", {"x"}, {"y"});
  newer.Output("y");
  EXPECT_THAT(LoadError(newer).message(), HasSubstr("opset 30"));
  GraphBuilder older(5);
  older.Input("a", onnx::TensorProto::FLOAT, {2}).Input("b", onnx::TensorProto::FLOAT, {2});
  older.Node("Add", {"a", "b"}, {"y"}, "old_add");
  older.Output("y");
  absl::Status status = LoadError(older);
  EXPECT_THAT(status.message(), HasSubstr("old_add"));
  EXPECT_THAT(status.message(), HasSubstr("opset 5"));
}

// ---------------------------------------------------------------------------------------------
// Bad models: each refused at load with an error that says what is wrong.

TEST(LoadTest, TruncatedModelRefused) {
  GraphBuilder builder(13);
  BuildConvChain(builder, false);
  const std::string bytes = builder.Bytes();
  ASSERT_NE(LoadOrDie(builder), nullptr);
  // Cut inside the graph: the protobuf parser sees a length running past the end.
  for (size_t keep : {bytes.size() / 2, bytes.size() - 1, size_t{3}}) {
    auto model = Model::Load(AsBytes(std::string_view(bytes).substr(0, keep)));
    EXPECT_FALSE(model.ok()) << "kept " << keep << " of " << bytes.size() << " bytes";
  }
  EXPECT_FALSE(Model::Load(ByteSpan()).ok());
}

TEST(LoadTest, MismatchedInputTypesRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2}).Input("i", onnx::TensorProto::INT64, {2});
  builder.Node("Add", {"x", "i"}, {"y"}, "mixed_add");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("mixed_add"));
}

TEST(LoadTest, DeclaredOutputTypeContradictionRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.Node("Relu", {"x"}, {"y"});
  builder.Output("y", onnx::TensorProto::INT64, std::vector<int64_t>{2});
  absl::Status status = LoadError(builder);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("'y'"));
}

TEST(LoadTest, MatMulInnerDimensionMismatchRefused) {
  GraphBuilder builder;
  builder.Input("a", onnx::TensorProto::FLOAT, {2, 3});
  builder.FloatInitializer("b", {4, 5}, std::vector<float>(20, 1.0f));
  builder.Node("MatMul", {"a", "b"}, {"y"}, "bad_matmul");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("bad_matmul"));
}

TEST(LoadTest, HugeInitializerRefusedWithoutAllocating) {
  // 2^40 float elements declared, no data: refused from the declared shape, not by trying to
  // allocate 4 TiB.
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  auto* tensor = builder.proto().mutable_graph()->add_initializer();
  tensor->set_name("w");
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  tensor->add_dims(int64_t{1} << 20);
  tensor->add_dims(int64_t{1} << 20);
  builder.Node("Add", {"x", "w"}, {"y"});
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("'w'"));
  // Dimensions whose product overflows int64 are refused too.
  tensor->clear_dims();
  for (int i = 0; i < 4; ++i) tensor->add_dims(int64_t{1} << 20);
  EXPECT_EQ(LoadError(builder).code(), absl::StatusCode::kInvalidArgument);
  tensor->clear_dims();
  tensor->add_dims(-4);
  EXPECT_EQ(LoadError(builder).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadTest, ReshapeToHugeConstantShapeRefused) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 3});
  builder.IntInitializer("shape", {3}, {int64_t{1} << 30, int64_t{1} << 30, 6});
  builder.Node("Reshape", {"x", "shape"}, {"y"}, "huge_reshape");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("huge_reshape"));
}

TEST(LoadTest, HugeConstantShapesRefused) {
  // ConstantOfShape of 2^42 elements with a constant shape: refused at load, where constant
  // folding would otherwise try to materialise it.
  {
    GraphBuilder builder;
    builder.IntInitializer("shape", {3}, {int64_t{1} << 14, int64_t{1} << 14, int64_t{1} << 14});
    builder.Node("ConstantOfShape", {"shape"}, {"y"}, "huge_fill");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr("huge_fill"));
  }
  // The same through Expand, and with a shape computed from constants (Concat).
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {1});
    builder.IntInitializer("rows", {1}, {int64_t{1} << 21});
    builder.IntInitializer("columns", {1}, {int64_t{1} << 21});
    SetInt(builder.Node("Concat", {"rows", "columns"}, {"shape"}), "axis", 0);
    builder.Node("Expand", {"x", "shape"}, {"y"}, "huge_expand");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr("huge_expand"));
  }
  // Tile by constant repeats: too large, and overflowing int64.
  for (int64_t repeat : {int64_t{1} << 31, int64_t{1} << 62}) {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {4, 4});
    builder.IntInitializer("repeats", {2}, {repeat, 2});
    builder.Node("Tile", {"x", "repeats"}, {"y"}, "huge_tile");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("huge_tile"));
  }
  // A negative dimension in a constant shape.
  {
    GraphBuilder builder;
    builder.IntInitializer("shape", {2}, {4, -3});
    builder.Node("ConstantOfShape", {"shape"}, {"y"}, "negative_fill");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr("negative_fill"));
  }
}

TEST(LoadTest, NodeOutputCountsChecked) {
  // A node without outputs (found by fuzzing: it used to trip an internal check).
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {2});
    builder.Node("Relu", {"x"}, {}, "silent_relu");
    builder.Node("Neg", {"x"}, {"y"});
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("silent_relu"));
  }
  // More outputs than the operator has.
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {2});
    builder.Node("Relu", {"x"}, {"y", "extra"}, "two_output_relu");
    builder.Output("y");
    absl::Status status = LoadError(builder);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("two_output_relu"));
  }
  // Fewer outputs than the operator always writes (TopK's indices are not optional).
  {
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, {4});
    builder.IntInitializer("k", {1}, {2});
    builder.Node("TopK", {"x", "k"}, {"values"}, "one_output_topk");
    builder.Output("values");
    absl::Status status = LoadError(builder);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("one_output_topk"));
  }
}

}  // namespace
}  // namespace cloister::runtime
