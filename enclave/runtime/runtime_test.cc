// Operator-level tests for the enclave's inference runtime: tensors, elementwise broadcasting,
// Conv, Slice, operator versions and MatMul. Models are built here with the ONNX protobuf
// classes; expected values come from plain reference loops. Load-time refusals are in
// runtime_load_test.cc, runs, graphs and fusion in runtime_graph_test.cc.
#include <cmath>
#include <cstring>
#include <random>

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
// Tensor basics.

TEST(TensorTest, KServeNamesRoundTrip) {
  for (DataType dtype :
       {DataType::kFloat, DataType::kDouble, DataType::kFloat16, DataType::kInt8, DataType::kInt16,
        DataType::kInt32, DataType::kInt64, DataType::kUint8, DataType::kUint16, DataType::kUint32,
        DataType::kUint64, DataType::kBool, DataType::kString}) {
    auto parsed = DataTypeFromKServe(KServeName(dtype));
    ASSERT_TRUE(parsed.ok()) << KServeName(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(KServeName(DataType::kFloat), "FP32");
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
  EXPECT_EQ(ElementSize(DataType::kFloat16), 2u);
  EXPECT_FALSE(DataTypeFromKServe("FLOAT32").ok());
}

TEST(TensorTest, CreateCloneAndReshape) {
  auto tensor = Tensor::Create(DataType::kFloat, {2, 3});
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->count(), 6);
  EXPECT_EQ(tensor->size(), 24u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor->raw_data()) % 64, 0u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(tensor->data<float>()[i], 0.0f);
  Tensor clone = tensor->Clone();
  clone.data<float>()[0] = 5.0f;
  EXPECT_EQ(tensor->data<float>()[0], 0.0f);
  Tensor view = tensor->Reshaped({3, 2});
  EXPECT_TRUE(tensor->BufferShared());
  EXPECT_EQ(view.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(Tensor::Create(DataType::kFloat, {2, -1}).ok());
  EXPECT_FALSE(Tensor::Create(DataType::kString, {2}).ok());
  EXPECT_FALSE(Tensor::FromVector<float>({2, 2}, {1, 2, 3}).ok());
}

TEST(TensorTest, ProtoConversionChecksSizes) {
  onnx::TensorProto proto;
  proto.set_data_type(onnx::TensorProto::FLOAT);
  proto.add_dims(3);
  proto.add_float_data(1);
  proto.add_float_data(2);
  EXPECT_FALSE(TensorFromProto(proto).ok());
  proto.add_float_data(3);
  auto tensor = TensorFromProto(proto);
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(Values(*tensor), (std::vector<float>{1, 2, 3}));
  onnx::TensorProto back = TensorToProto(*tensor, "t");
  auto again = TensorFromProto(back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Values(*again), (std::vector<float>{1, 2, 3}));
}

// ---------------------------------------------------------------------------------------------
// Elementwise broadcasting.

// Reference numpy broadcasting on flat arrays.
std::vector<float> ReferenceBroadcast(const std::vector<int64_t>& a_shape,
                                      const std::vector<float>& a,
                                      const std::vector<int64_t>& b_shape,
                                      const std::vector<float>& b,
                                      const std::vector<int64_t>& out_shape,
                                      float (*op)(float, float)) {
  const size_t rank = out_shape.size();
  int64_t count = 1;
  for (int64_t d : out_shape) count *= d;
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> index(rank);
    int64_t rest = i;
    for (size_t d = rank; d-- > 0;) {
      index[d] = rest % out_shape[d];
      rest /= out_shape[d];
    }
    auto offset = [&](const std::vector<int64_t>& shape) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t at = index[rank - shape.size() + d];
        off = off * shape[d] + (shape[d] == 1 ? 0 : at);
      }
      return off;
    };
    out[i] = op(a[offset(a_shape)], b[offset(b_shape)]);
  }
  return out;
}

struct BroadcastCase {
  std::vector<int64_t> a, b, out;
};

TEST(ElementwiseTest, BroadcastingMatchesReference) {
  const std::vector<BroadcastCase> cases = {
      {{2, 3}, {3}, {2, 3}},
      {{2, 1, 3}, {4, 1}, {2, 4, 3}},
      {{1}, {2, 2}, {2, 2}},
      {{3, 1, 5}, {1, 4, 1}, {3, 4, 5}},
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},
      {{}, {3}, {3}},
      {{1, 3, 1, 2}, {2, 1, 4, 1}, {2, 3, 4, 2}},
  };
  struct Op {
    const char* name;
    float (*fn)(float, float);
  };
  const Op ops[] = {{"Add", [](float x, float y) { return x + y; }},
                    {"Sub", [](float x, float y) { return x - y; }},
                    {"Mul", [](float x, float y) { return x * y; }},
                    {"Div", [](float x, float y) { return x / y; }}};
  int seed = 1;
  for (const BroadcastCase& c : cases) {
    for (const Op& op : ops) {
      GraphBuilder builder;
      builder.Input("a", onnx::TensorProto::FLOAT, c.a).Input("b", onnx::TensorProto::FLOAT, c.b);
      builder.Node(op.name, {"a", "b"}, {"y"});
      builder.Output("y");
      auto model = LoadOrDie(builder);
      ASSERT_NE(model, nullptr);
      EXPECT_EQ(model->outputs()[0].shape, c.out);
      int64_t ca = 1, cb = 1;
      for (int64_t d : c.a) ca *= d;
      for (int64_t d : c.b) cb *= d;
      std::vector<float> a = RandomFloats(ca, seed++), b = RandomFloats(cb, seed++);
      for (float& v : b) v += v >= 0 ? 0.5f : -0.5f;  // keep Div away from zero
      Tensor y = RunOne(*model, {{"a", FloatTensor(c.a, a)}, {"b", FloatTensor(c.b, b)}});
      EXPECT_EQ(y.shape(), c.out) << op.name;
      ExpectNear(Values(y), ReferenceBroadcast(c.a, a, c.b, b, c.out, op.fn), 1e-6f);
    }
  }
}

TEST(ElementwiseTest, IncompatibleShapesRefusedAtLoad) {
  GraphBuilder builder;
  builder.Input("a", onnx::TensorProto::FLOAT, {2, 3}).Input("b", onnx::TensorProto::FLOAT, {4});
  builder.Node("Add", {"a", "b"}, {"y"}, "add_bad");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("add_bad"));
  EXPECT_THAT(status.message(), HasSubstr("do not broadcast"));
}

TEST(ElementwiseTest, IntegerDivisionByZeroIsAnError) {
  GraphBuilder builder;
  builder.Input("a", onnx::TensorProto::INT64, {2}).Input("b", onnx::TensorProto::INT64, {2});
  builder.Node("Div", {"a", "b"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  auto a = Tensor::FromVector<int64_t>({2}, {6, 7});
  auto b = Tensor::FromVector<int64_t>({2}, {3, 0});
  auto result = model->Run({{"a", *a}, {"b", *b}});
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("division by zero"));
}

TEST(ElementwiseTest, ClipSixUsesAttributes) {
  GraphBuilder builder(9);
  builder.Input("x", onnx::TensorProto::FLOAT, {4});
  auto& node = builder.Node("Clip", {"x"}, {"y"});
  SetFloat(node, "min", -1.0f);
  SetFloat(node, "max", 0.5f);
  builder.Output("y");
  auto model = LoadOrDie(builder);
  Tensor y = RunOne(*model, {{"x", FloatTensor({4}, {-3, -0.5, 0.25, 2})}});
  EXPECT_EQ(Values(y), (std::vector<float>{-1, -0.5, 0.25, 0.5}));
}

TEST(ElementwiseTest, WhereAndEqualBroadcast) {
  GraphBuilder builder(14);
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 2});
  builder.FloatInitializer("zero", {}, {0.0f}).FloatInitializer("minus", {1}, {-100.0f});
  builder.Node("Equal", {"x", "zero"}, {"is_zero"});
  builder.Node("Where", {"is_zero", "minus", "x"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  Tensor y = RunOne(*model, {{"x", FloatTensor({2, 2}, {0, 1, 2, 0})}});
  EXPECT_EQ(Values(y), (std::vector<float>{-100, 1, 2, -100}));
}

// ---------------------------------------------------------------------------------------------
// Conv against a direct reference.

struct ConvCase {
  std::string label;
  std::vector<int64_t> x_shape;  // N, C, spatial...
  int64_t maps;
  std::vector<int64_t> kernel;
  int64_t group;
  std::vector<int64_t> strides, pads, dilations;
  bool bias;
  std::string auto_pad = "NOTSET";
};

// Direct convolution for 1-D and 2-D inputs (1-D as height 1).
std::vector<float> ReferenceConv(const ConvCase& c, const std::vector<float>& x,
                                 const std::vector<float>& w, const std::vector<float>& b,
                                 std::vector<int64_t>* out_shape) {
  const bool two_d = c.x_shape.size() == 4;
  const int64_t n_batch = c.x_shape[0], channels = c.x_shape[1];
  const int64_t H = two_d ? c.x_shape[2] : 1, W = c.x_shape.back();
  const int64_t KH = two_d ? c.kernel[0] : 1, KW = c.kernel.back();
  const int64_t SH = two_d ? c.strides[0] : 1, SW = c.strides.back();
  const int64_t DH = two_d ? c.dilations[0] : 1, DW = c.dilations.back();
  const size_t r = c.kernel.size();
  int64_t PH0 = two_d ? c.pads[0] : 0, PW0 = c.pads[r - 1];
  int64_t PH1 = two_d ? c.pads[r] : 0, PW1 = c.pads[2 * r - 1];
  if (c.auto_pad == "SAME_UPPER") {
    auto same = [](int64_t in, int64_t k, int64_t s, int64_t d, int64_t* p0, int64_t* p1) {
      const int64_t out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + d * (k - 1) + 1 - in);
      *p0 = total / 2;
      *p1 = total - *p0;
    };
    if (two_d) same(H, KH, SH, DH, &PH0, &PH1);
    same(W, KW, SW, DW, &PW0, &PW1);
  }
  const int64_t OH = (H + PH0 + PH1 - DH * (KH - 1) - 1) / SH + 1;
  const int64_t OW = (W + PW0 + PW1 - DW * (KW - 1) - 1) / SW + 1;
  const int64_t cg = channels / c.group, mg = c.maps / c.group;
  *out_shape = two_d ? std::vector<int64_t>{n_batch, c.maps, OH, OW}
                     : std::vector<int64_t>{n_batch, c.maps, OW};
  std::vector<float> y(n_batch * c.maps * OH * OW);
  for (int64_t n = 0; n < n_batch; ++n) {
    for (int64_t m = 0; m < c.maps; ++m) {
      const int64_t g = m / mg;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          double sum = c.bias ? b[m] : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            for (int64_t kh = 0; kh < KH; ++kh) {
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * SH - PH0 + kh * DH, iw = ow * SW - PW0 + kw * DW;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                sum += x[((n * channels + g * cg + ci) * H + ih) * W + iw] *
                       w[((m * cg + ci) * KH + kh) * KW + kw];
              }
            }
          }
          y[((n * c.maps + m) * OH + oh) * OW + ow] = static_cast<float>(sum);
        }
      }
    }
  }
  return y;
}

TEST(ConvTest, MatchesReferenceForGroupsPadsStridesDilations) {
  const std::vector<ConvCase> cases = {
      {"plain3x3_stride2_pad1", {2, 3, 9, 11}, 4, {3, 3}, 1, {2, 2}, {1, 1, 1, 1}, {1, 1}, true},
      {"pointwise", {1, 8, 5, 6}, 6, {1, 1}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, true},
      {"depthwise_dilated", {1, 6, 8, 8}, 6, {3, 3}, 6, {1, 1}, {2, 2, 2, 2}, {2, 2}, true},
      {"depthwise_stride_asym_pads",
       {2, 4, 7, 9},
       4,
       {5, 3},
       4,
       {2, 1},
       {2, 0, 1, 2},
       {1, 1},
       false},
      {"grouped", {1, 6, 6, 7}, 4, {3, 2}, 2, {1, 2}, {1, 0, 0, 1}, {1, 1}, true},
      {"depthwise_multiplier", {1, 3, 6, 6}, 6, {3, 3}, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},
      // Rows wide enough for the depthwise kernel's blocks of four vectors, and their tails.
      {"depthwise_wide_5x5", {2, 5, 6, 77}, 5, {5, 5}, 5, {1, 1}, {2, 2, 2, 2}, {1, 1}, true},
      {"depthwise_wide_stride_h2", {1, 4, 7, 70}, 4, {3, 3}, 4, {2, 1}, {1, 1, 1, 1}, {1, 1}, true},
      {"depthwise_wide_dilated", {1, 3, 9, 40}, 3, {3, 3}, 3, {1, 1}, {2, 2, 2, 2}, {2, 2}, false},
      {"conv1d_stride", {2, 3, 20}, 5, {4}, 1, {3}, {1, 2}, {1}, true},
      {"same_upper", {1, 2, 7, 8}, 3, {3, 3}, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, "SAME_UPPER"},
  };
  uint32_t seed = 100;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.label);
    const int64_t cg = c.x_shape[1] / c.group;
    std::vector<int64_t> w_shape = {c.maps, cg};
    for (int64_t k : c.kernel) w_shape.push_back(k);
    int64_t x_count = 1, w_count = 1;
    for (int64_t d : c.x_shape) x_count *= d;
    for (int64_t d : w_shape) w_count *= d;
    std::vector<float> x = RandomFloats(x_count, seed++), w = RandomFloats(w_count, seed++),
                       b = RandomFloats(c.maps, seed++);
    GraphBuilder builder;
    builder.Input("x", onnx::TensorProto::FLOAT, c.x_shape);
    builder.FloatInitializer("w", w_shape, w);
    if (c.bias) builder.FloatInitializer("b", {c.maps}, b);
    std::vector<std::string> inputs = {"x", "w"};
    if (c.bias) inputs.push_back("b");
    auto& node = builder.Node("Conv", inputs, {"y"});
    SetInt(node, "group", c.group);
    SetInts(node, "strides", c.strides);
    SetInts(node, "dilations", c.dilations);
    if (c.auto_pad == "NOTSET") {
      SetInts(node, "pads", c.pads);
    } else {
      SetString(node, "auto_pad", c.auto_pad);
    }
    builder.Output("y");
    auto model = LoadOrDie(builder);
    ASSERT_NE(model, nullptr);
    std::vector<int64_t> want_shape;
    std::vector<float> want = ReferenceConv(c, x, w, b, &want_shape);
    EXPECT_EQ(model->outputs()[0].shape, want_shape);  // inferred at load
    Tensor y = RunOne(*model, {{"x", FloatTensor(c.x_shape, x)}});
    EXPECT_EQ(y.shape(), want_shape);
    ExpectNear(Values(y), want, 1e-5f);
  }
}

TEST(ConvTest, ChannelMismatchRefusedAtLoad) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {1, 3, 8, 8});
  builder.FloatInitializer("w", {4, 2, 3, 3}, std::vector<float>(72, 0.1f));
  builder.Node("Conv", {"x", "w"}, {"y"}, "conv_bad");
  builder.Output("y");
  absl::Status status = LoadError(builder);
  EXPECT_THAT(status.message(), HasSubstr("conv_bad"));
  EXPECT_THAT(status.message(), HasSubstr("(Conv)"));
  EXPECT_THAT(status.message(), HasSubstr("channels"));
}

// ---------------------------------------------------------------------------------------------
// Slice.

TEST(SliceTest, NegativeIndicesStepsAndClamping) {
  GraphBuilder builder(13);
  builder.Input("x", onnx::TensorProto::FLOAT, {3, 5});
  builder.IntInitializer("starts", {2}, {-1, -2}).IntInitializer("ends", {2}, {-4, -100});
  builder.IntInitializer("axes", {2}, {1, 0}).IntInitializer("steps", {2}, {-1, -2});
  builder.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  std::vector<float> x(15);
  for (int i = 0; i < 15; ++i) x[i] = static_cast<float>(i);
  Tensor y = RunOne(*model, {{"x", FloatTensor({3, 5}, x)}});
  // Rows 1 then ... (start -2 -> 1, step -2 -> rows 1 only since end clamps to -1);
  // columns 4,3,2 (start -1 -> 4, end -4 -> 1, exclusive).
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(Values(y), (std::vector<float>{9, 8, 7}));
}

TEST(SliceTest, SliceOneUsesAttributesAndClampsLargeEnds) {
  GraphBuilder builder(9);
  builder.Input("x", onnx::TensorProto::FLOAT, {-1, 4});
  auto& node = builder.Node("Slice", {"x"}, {"y"});
  SetInts(node, "starts", {1});
  SetInts(node, "ends", {INT64_MAX});
  SetInts(node, "axes", {1});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  Tensor y = RunOne(*model, {{"x", FloatTensor({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})}});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values(y), (std::vector<float>{1, 2, 3, 5, 6, 7}));
}

// ---------------------------------------------------------------------------------------------
// Softmax, Split, ReduceMean versions.

TEST(VersionTest, SoftmaxOneCoercesTo2D) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int opset : {9, 13}) {
    GraphBuilder builder(opset);
    builder.Input("x", onnx::TensorProto::FLOAT, {2, 2, 2});
    auto& node = builder.Node("Softmax", {"x"}, {"y"});
    SetInt(node, "axis", 1);
    builder.Output("y");
    auto model = LoadOrDie(builder);
    Tensor y = RunOne(*model, {{"x", FloatTensor({2, 2, 2}, x)}});
    std::vector<float> want(8);
    if (opset == 9) {  // softmax over each row of 4
      for (int r = 0; r < 2; ++r) {
        double sum = 0;
        for (int i = 0; i < 4; ++i) sum += std::exp(x[r * 4 + i]);
        for (int i = 0; i < 4; ++i)
          want[r * 4 + i] = static_cast<float>(std::exp(x[r * 4 + i]) / sum);
      }
    } else {  // softmax along axis 1 only (pairs 2 apart)
      for (int n = 0; n < 2; ++n) {
        for (int k = 0; k < 2; ++k) {
          const float a = x[n * 4 + k], b = x[n * 4 + 2 + k];
          const double sum = std::exp(a) + std::exp(b);
          want[n * 4 + k] = static_cast<float>(std::exp(a) / sum);
          want[n * 4 + 2 + k] = static_cast<float>(std::exp(b) / sum);
        }
      }
    }
    ExpectNear(Values(y), want, 1e-6f);
  }
}

TEST(VersionTest, SplitEighteenNumOutputsUneven) {
  GraphBuilder builder(18);
  builder.Input("x", onnx::TensorProto::FLOAT, {5});
  auto& node = builder.Node("Split", {"x"}, {"a", "b"});
  SetInt(node, "num_outputs", 2);
  builder.Output("a").Output("b");
  auto model = LoadOrDie(builder);
  auto outputs = model->Run({{"x", FloatTensor({5}, {1, 2, 3, 4, 5})}});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(Values((*outputs)[0].second), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Values((*outputs)[1].second), (std::vector<float>{4, 5}));
}

TEST(VersionTest, ReduceMeanAxesAttributeAndInput) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  {
    GraphBuilder builder(13);
    builder.Input("x", onnx::TensorProto::FLOAT, {2, 3});
    auto& node = builder.Node("ReduceMean", {"x"}, {"y"});
    SetInts(node, "axes", {-1});
    builder.Output("y");
    auto model = LoadOrDie(builder);
    Tensor y = RunOne(*model, {{"x", FloatTensor({2, 3}, x)}});
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(Values(y), (std::vector<float>{2, 5}));
  }
  {
    GraphBuilder builder(18);
    builder.Input("x", onnx::TensorProto::FLOAT, {2, 3});
    builder.IntInitializer("axes", {1}, {0});
    auto& node = builder.Node("ReduceMean", {"x", "axes"}, {"y"});
    SetInt(node, "keepdims", 0);
    builder.Output("y");
    auto model = LoadOrDie(builder);
    Tensor y = RunOne(*model, {{"x", FloatTensor({2, 3}, x)}});
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{3}));
    EXPECT_EQ(Values(y), (std::vector<float>{2.5, 3.5, 4.5}));
  }
}

TEST(VersionTest, OpsetSixBroadcastFollowsAxisAttribute) {
  // Add-6 with broadcast=1, axis=1: B of shape [3] runs along A's second axis (numpy would
  // align it with the last one).
  GraphBuilder builder(6);
  builder.Input("a", onnx::TensorProto::FLOAT, {2, 3, 4});
  builder.FloatInitializer("b", {3}, {10, 20, 30});
  auto& add = builder.Node("Add", {"a", "b"}, {"y"}, "legacy_add");
  SetInt(add, "broadcast", 1);
  SetInt(add, "axis", 1);
  builder.Output("y");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  std::vector<float> a = RandomFloats(24, 7);
  Tensor y = RunOne(*model, {{"a", FloatTensor({2, 3, 4}, a)}});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 4}));
  std::vector<float> want(24);
  for (int i = 0; i < 24; ++i) want[i] = a[i] + 10.0f * (1 + (i / 4) % 3);
  ExpectNear(Values(y), want, 1e-6f);

  // Without broadcast=1 the shapes must be equal; with it, B must fit at the axis.
  add.mutable_attribute()->Clear();
  EXPECT_THAT(LoadError(builder).message(), HasSubstr("broadcast=1"));
  SetInt(add, "broadcast", 1);
  SetInt(add, "axis", 2);
  absl::Status status = LoadError(builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("legacy_add"));
}

TEST(VersionTest, BatchNormTrainingModeUsesBatchStatistics) {
  GraphBuilder builder(15);
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 1, 2});
  builder.FloatInitializer("scale", {1}, {2}).FloatInitializer("bias", {1}, {1});
  builder.FloatInitializer("mean", {1}, {5}).FloatInitializer("var", {1}, {3});
  auto& node = builder.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"},
                            {"y", "running_mean", "running_var"});
  SetInt(node, "training_mode", 1);
  SetFloat(node, "epsilon", 0.0f);
  SetFloat(node, "momentum", 0.5f);
  builder.Output("y").Output("running_mean").Output("running_var");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  // Batch mean 2.5, population variance 1.25.
  auto outputs = model->Run({{"x", FloatTensor({2, 1, 2}, {1, 2, 3, 4})}});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const float sd = std::sqrt(1.25f);
  ExpectNear(Values((*outputs)[0].second),
             {2 * -1.5f / sd + 1, 2 * -0.5f / sd + 1, 2 * 0.5f / sd + 1, 2 * 1.5f / sd + 1}, 1e-5f);
  ExpectNear(Values((*outputs)[1].second), {0.5f * 5 + 0.5f * 2.5f}, 1e-6f);
  ExpectNear(Values((*outputs)[2].second), {0.5f * 3 + 0.5f * 1.25f}, 1e-6f);
}

TEST(MatMulTest, BatchedBroadcastMatchesReference) {
  GraphBuilder builder;
  builder.Input("a", onnx::TensorProto::FLOAT, {2, 1, 3, 4})
      .Input("b", onnx::TensorProto::FLOAT, {3, 4, 2});
  builder.Node("MatMul", {"a", "b"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  std::vector<float> a = RandomFloats(24, 7), b = RandomFloats(24, 8);
  Tensor y =
      RunOne(*model, {{"a", FloatTensor({2, 1, 3, 4}, a)}, {"b", FloatTensor({3, 4, 2}, b)}});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 3, 2}));
  std::vector<float> want;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int m = 0; m < 3; ++m) {
        for (int n = 0; n < 2; ++n) {
          double sum = 0;
          for (int k = 0; k < 4; ++k) sum += a[(i * 3 + m) * 4 + k] * b[(j * 4 + k) * 2 + n];
          want.push_back(static_cast<float>(sum));
        }
      }
    }
  }
  ExpectNear(Values(y), want, 1e-6f);
}

}  // namespace
}  // namespace cloister::runtime
