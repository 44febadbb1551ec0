// Operator-level and load-time validation tests for the enclave's inference runtime. Models are
// built here with the ONNX protobuf classes; expected values come from plain reference loops.
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "enclave/runtime/gemm.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Model> LoadOrDie(const GraphBuilder& builder) {
  std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

absl::Status LoadError(const GraphBuilder& builder) {
  std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  return model.ok() ? absl::OkStatus() : model.status();
}

Tensor FloatTensor(std::vector<int64_t> shape, std::vector<float> values) {
  auto tensor = Tensor::FromVector<float>(std::move(shape), values);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return std::move(tensor).value();
}


std::vector<float> Values(const Tensor& tensor) {
  const float* data = tensor.data<float>();
  return std::vector<float>(data, data + tensor.count());
}

Tensor RunOne(const Model& model, std::vector<std::pair<std::string, Tensor>> inputs) {
  auto outputs = model.Run(inputs);
  EXPECT_TRUE(outputs.ok()) << outputs.status();
  if (!outputs.ok() || outputs->empty()) return Tensor();
  return (*outputs)[0].second;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance + tolerance * std::fabs(want[i])) << "element " << i;
  }
}

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
// Run-time input validation.

class RunValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GraphBuilder builder;
    builder.Input("pixels", onnx::TensorProto::FLOAT, {-1, 3});
    builder.FloatInitializer("bias", {3}, {1, 2, 3});
    builder.Node("Add", {"pixels", "bias"}, {"sum"});
    builder.Node("Relu", {"sum"}, {"relu"});
    builder.Output("sum").Output("relu");
    model_ = LoadOrDie(builder);
    ASSERT_NE(model_, nullptr);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(RunValidationTest, SpecsReportDynamicBatch) {
  ASSERT_EQ(model_->inputs().size(), 1u);
  EXPECT_EQ(model_->inputs()[0].name, "pixels");
  EXPECT_EQ(model_->inputs()[0].dtype, DataType::kFloat);
  EXPECT_EQ(model_->inputs()[0].shape, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(model_->outputs()[1].shape, (std::vector<int64_t>{-1, 3}));
}

TEST_F(RunValidationTest, WrongTypeRankShapeAndNamesRefused) {
  auto wrong_type = Tensor::FromVector<int64_t>({1, 3}, {1, 2, 3});
  auto status = model_->Run({{"pixels", *wrong_type}}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("pixels"));
  EXPECT_THAT(status.message(), HasSubstr("FP32"));

  status = model_->Run({{"pixels", FloatTensor({3}, {1, 2, 3})}}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("pixels"));

  status = model_->Run({{"pixels", FloatTensor({1, 4}, {1, 2, 3, 4})}}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("[?,3]"));

  status = model_->Run({}).status();
  EXPECT_THAT(status.message(), HasSubstr("missing"));
  status =
      model_->Run({{"pixels", FloatTensor({1, 3}, {1, 2, 3})}, {"other", FloatTensor({1}, {1})}})
          .status();
  EXPECT_THAT(status.message(), HasSubstr("other"));
  status = model_->Run({{"pixels", FloatTensor({1, 3}, {1, 2, 3})}}, {"nope"}).status();
  EXPECT_THAT(status.message(), HasSubstr("nope"));
}

TEST_F(RunValidationTest, DynamicBatchAndRequestedOutputs) {
  auto all = model_->Run({{"pixels", FloatTensor({2, 3}, {-5, 0, 1, 2, -3, -9})}});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].first, "sum");
  EXPECT_EQ(Values((*all)[0].second), (std::vector<float>{-4, 2, 4, 3, -1, -6}));
  EXPECT_EQ(Values((*all)[1].second), (std::vector<float>{0, 2, 4, 3, 0, 0}));
  auto some = model_->Run({{"pixels", FloatTensor({1, 3}, {1, 1, 1})}}, {"relu"});
  ASSERT_TRUE(some.ok()) << some.status();
  ASSERT_EQ(some->size(), 1u);
  EXPECT_EQ((*some)[0].first, "relu");
  EXPECT_EQ(Values((*some)[0].second), (std::vector<float>{2, 3, 4}));
}

TEST_F(RunValidationTest, ConcurrentRunsAgree) {
  std::vector<std::thread> threads;
  std::vector<bool> ok(4, false);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool good = true;
      for (int i = 0; i < 200; ++i) {
        const float v = static_cast<float>(t * 1000 + i);
        auto out = model_->Run({{"pixels", FloatTensor({1, 3}, {v, v, v})}});
        good =
            good && out.ok() && Values((*out)[1].second) == std::vector<float>{v + 1, v + 2, v + 3};
      }
      ok[t] = good;
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

TEST(ConcurrencyTest, ConvMatMulModelFromManyThreadsMatchesSerial) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {-1, 3, 12, 12});
  builder.FloatInitializer("w", {8, 3, 3, 3}, RandomFloats(216, 31));
  builder.FloatInitializer("fc", {8 * 6 * 6, 5}, RandomFloats(288 * 5, 32));
  builder.IntInitializer("flat", {2}, {0, -1});
  auto& conv = builder.Node("Conv", {"x", "w"}, {"c"});
  SetInts(conv, "strides", {2, 2});
  SetInts(conv, "pads", {1, 1, 1, 1});
  builder.Node("Relu", {"c"}, {"r"});
  builder.Node("Reshape", {"r", "flat"}, {"f"});
  builder.Node("MatMul", {"f", "fc"}, {"logits"});
  builder.Node("Softmax", {"logits"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  std::vector<Tensor> inputs;
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < 8; ++i) {
    const int64_t batch = 1 + i % 3;
    inputs.push_back(FloatTensor({batch, 3, 12, 12}, RandomFloats(batch * 432, 40 + i)));
    expected.push_back(Values(RunOne(*model, {{"x", inputs.back()}})));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 25; ++round) {
        const int i = (t + round) % 8;
        auto out = model->Run({{"x", inputs[i]}});
        if (!out.ok() || Values((*out)[0].second) != expected[i]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// ---------------------------------------------------------------------------------------------
// Graph-level behaviour.

TEST(GraphTest, ShapeArithmeticFoldsAtLoad) {
  GraphBuilder builder(13);
  builder.Input("x", onnx::TensorProto::FLOAT, {2, 3, 4});
  builder.Node("Shape", {"x"}, {"shape"});
  builder.IntInitializer("index", {}, {2});
  builder.Node("Gather", {"shape", "index"}, {"last"});
  builder.IntInitializer("axes", {1}, {0});
  builder.Node("Unsqueeze", {"last", "axes"}, {"last1"});
  builder.IntInitializer("minus_one", {1}, {-1});
  builder.Node("Concat", {"minus_one", "last1"}, {"target"}).add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(0);
    return a;
  }());
  builder.Node("Reshape", {"x", "target"}, {"y"});
  builder.Output("y");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->step_count(), 1u);  // only the Reshape runs
  EXPECT_EQ(model->outputs()[0].shape, (std::vector<int64_t>{6, 4}));
  std::vector<float> x(24, 1.0f);
  Tensor y = RunOne(*model, {{"x", FloatTensor({2, 3, 4}, x)}});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{6, 4}));
}

TEST(GraphTest, ConstantOutputsAreNotShared) {
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {2});
  builder.FloatInitializer("c", {2}, {7, 8});
  builder.Node("Identity", {"c"}, {"const_out"});
  builder.Node("Identity", {"x"}, {"passthrough"});
  builder.Output("const_out").Output("passthrough");
  auto model = LoadOrDie(builder);
  Tensor input = FloatTensor({2}, {1, 2});
  auto first = model->Run({{"x", input}});
  ASSERT_TRUE(first.ok()) << first.status();
  (*first)[0].second.data<float>()[0] = -1;
  (*first)[1].second.data<float>()[0] = -1;
  EXPECT_EQ(input.data<float>()[0], 1.0f);
  auto second = model->Run({{"x", input}});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Values((*second)[0].second), (std::vector<float>{7, 8}));
}

TEST(GraphTest, IfRunsTheChosenBranchWithOuterValues) {
  GraphBuilder builder(13);
  builder.Input("flag", onnx::TensorProto::BOOL, {});
  builder.Input("x", onnx::TensorProto::FLOAT, {3});
  auto& node = builder.Node("If", {"flag"}, {"y"}, "choose");
  auto make_branch = [](const std::string& op) {
    onnx::GraphProto graph;
    graph.set_name(op);
    auto* inner = graph.add_node();
    inner->set_op_type(op);
    inner->add_input("x");  // outer-scope value
    inner->add_output("branch_out");
    graph.add_output()->set_name("branch_out");
    return graph;
  };
  auto* then_attr = node.add_attribute();
  then_attr->set_name("then_branch");
  then_attr->set_type(onnx::AttributeProto::GRAPH);
  *then_attr->mutable_g() = make_branch("Relu");
  auto* else_attr = node.add_attribute();
  else_attr->set_name("else_branch");
  else_attr->set_type(onnx::AttributeProto::GRAPH);
  *else_attr->mutable_g() = make_branch("Neg");
  builder.Output("y");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  auto flag_true = Tensor::FromVector<bool>({}, {true});
  auto flag_false = Tensor::FromVector<bool>({}, {false});
  Tensor x = FloatTensor({3}, {-1, 0, 2});
  EXPECT_EQ(Values(RunOne(*model, {{"flag", *flag_true}, {"x", x}})),
            (std::vector<float>{0, 0, 2}));
  EXPECT_EQ(Values(RunOne(*model, {{"flag", *flag_false}, {"x", x}})),
            (std::vector<float>{1, 0, -2}));
}

// A run's deadline reaches inside long steps: a convolution over many images stops between two
// images, also inside an If branch. The deadline is an eighth of the step's measured full time,
// and the stopped run must end well before the full time (relative, so machine speed does not
// matter).
class DeadlineInsideAStep : public ::testing::Test {
 protected:
  // x [n, 1, 32, 32] -> Conv with 4 maps of 5x5 -> y; inside an If branch when `branched`.
  static GraphBuilder ConvModel(bool branched) {
    GraphBuilder builder(13);
    builder.Input("x", onnx::TensorProto::FLOAT, {-1, 1, 32, 32})
        .FloatInitializer("w", {4, 1, 5, 5}, std::vector<float>(100, 0.04f));
    if (!branched) {
      builder.Node("Conv", {"x", "w"}, {"y"}, "conv");
      builder.Output("y");
      return builder;
    }
    builder.Input("flag", onnx::TensorProto::BOOL, {});
    auto& node = builder.Node("If", {"flag"}, {"y"}, "choose");
    auto branch = [](bool conv) {
      onnx::GraphProto graph;
      graph.set_name(conv ? "convolve" : "pass");
      auto* inner = graph.add_node();
      inner->set_op_type(conv ? "Conv" : "Identity");
      inner->set_name(conv ? "conv" : "pass");
      inner->add_input("x");
      if (conv) inner->add_input("w");
      inner->add_output("branch_out");
      graph.add_output()->set_name("branch_out");
      return graph;
    };
    for (const auto& [name, conv] : {std::pair{"then_branch", true}, {"else_branch", false}}) {
      auto* attribute = node.add_attribute();
      attribute->set_name(name);
      attribute->set_type(onnx::AttributeProto::GRAPH);
      *attribute->mutable_g() = branch(conv);
    }
    builder.Output("y");
    return builder;
  }

  static void ExpectStopsEarly(const Model& model,
                               const std::vector<std::pair<std::string, Tensor>>& inputs,
                               const std::string& node = "'conv' (Conv)") {
    const absl::Time start = absl::Now();
    ASSERT_TRUE(model.Run(inputs).ok());
    const absl::Duration full = absl::Now() - start;
    const absl::Time limited_start = absl::Now();
    auto stopped = model.Run(inputs, {}, limited_start + full / 8);
    const absl::Duration taken = absl::Now() - limited_start;
    ASSERT_FALSE(stopped.ok());
    EXPECT_EQ(stopped.status().code(), absl::StatusCode::kDeadlineExceeded) << stopped.status();
    EXPECT_THAT(stopped.status().message(), HasSubstr("inside this step"));
    EXPECT_THAT(stopped.status().message(), HasSubstr(node));
    EXPECT_LT(taken, full / 2) << "full run " << full;
  }

  Tensor images_ = FloatTensor({3000, 1, 32, 32}, RandomFloats(3000 * 32 * 32, 5));
};

TEST_F(DeadlineInsideAStep, AConvolutionStopsBetweenImages) {
  auto model = LoadOrDie(ConvModel(false));
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->step_count(), 1u);  // the between-step check cannot be what stops it
  ExpectStopsEarly(*model, {{"x", images_}});
}

TEST_F(DeadlineInsideAStep, AnIfBranchGetsTheRunsDeadline) {
  auto model = LoadOrDie(ConvModel(true));
  ASSERT_NE(model, nullptr);
  ExpectStopsEarly(*model, {{"flag", *Tensor::FromVector<bool>({}, {true})}, {"x", images_}});
}

// One matrix product of 8192 x 512 by 512 x 512 (8 row blocks of kRowBlockMultiplyAdds) stops
// between two blocks; so does a Gemm, whose A comes transposed.
TEST_F(DeadlineInsideAStep, AMatrixProductStopsBetweenRowBlocks) {
  for (const std::string op : {"MatMul", "Gemm"}) {
    SCOPED_TRACE(op);
    GraphBuilder builder(13);
    const bool gemm = op == "Gemm";
    builder
        .Input("x", onnx::TensorProto::FLOAT,
               gemm ? std::vector<int64_t>{512, 8192} : std::vector<int64_t>{8192, 512})
        .FloatInitializer("w", {512, 512}, RandomFloats(512 * 512, 6));
    auto& node = builder.Node(op, {"x", "w"}, {"y"}, "product");
    if (gemm) SetInt(node, "transA", 1);
    builder.Output("y");
    auto model = LoadOrDie(builder);
    ASSERT_NE(model, nullptr);
    ASSERT_EQ(model->step_count(), 1u);
    const std::vector<int64_t> shape =
        gemm ? std::vector<int64_t>{512, 8192} : std::vector<int64_t>{8192, 512};
    ExpectStopsEarly(*model, {{"x", FloatTensor(shape, RandomFloats(8192 * 512, 7))}},
                     "'product' (" + op + ")");
  }
}

// Blocked products compute what one product computes: every transpose combination, in blocks
// of 7 rows (the last one shorter), against a plain loop in double; an error between two blocks
// stops the product there, leaving the later rows as they were.
TEST(GemmInRowBlocksTest, BlocksGiveTheSameProductAsOneCallAndStopAtAnError) {
  const int64_t m = 67, n = 9, k = 8, block = 7 * n * k;
  const std::vector<float> a = RandomFloats(m * k, 1), b = RandomFloats(k * n, 2);
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      SCOPED_TRACE(absl::StrCat("transpose_a ", transpose_a, " transpose_b ", transpose_b));
      // op(A) is m x k: stored m x k, or k x m when transposed; op(B) likewise k x n.
      auto a_at = [&](int64_t i, int64_t p) { return transpose_a ? a[p * m + i] : a[i * k + p]; };
      auto b_at = [&](int64_t p, int64_t j) { return transpose_b ? b[j * k + p] : b[p * n + j]; };
      auto product = [&](int stop_at_call, int& calls) {
        std::vector<float> c(m * n, 1.0f);
        absl::Status status = GemmInRowBlocks<float>(
            transpose_a, transpose_b, m, n, k, 2.0f, a.data(), transpose_a ? m : k, b.data(),
            transpose_b ? k : n, 0.5f, c.data(), n,
            [&] {
              return ++calls == stop_at_call ? absl::DeadlineExceededError("stop")
                                             : absl::OkStatus();
            },
            block);
        return std::make_pair(status, c);
      };
      int calls = 0;
      auto [status, c] = product(/*stop_at_call=*/0, calls);
      ASSERT_TRUE(status.ok());
      EXPECT_EQ(calls, 9);  // between the 10 blocks
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0.5;
          for (int64_t p = 0; p < k; ++p) want += 2.0 * a_at(i, p) * b_at(p, j);
          ASSERT_NEAR(c[i * n + j], want, 1e-4) << "row " << i << " column " << j;
        }
      }
      calls = 0;
      auto [stopped, partial] = product(/*stop_at_call=*/3, calls);
      EXPECT_EQ(stopped.code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_EQ(calls, 3);
      for (int64_t i = 0; i < m; ++i) {
        // Three blocks of 7 rows ran; the rest is untouched.
        if (i < 21) {
          EXPECT_EQ(partial[i * n], c[i * n]) << "row " << i;
        } else {
          EXPECT_EQ(partial[i * n], 1.0f) << "row " << i;
        }
      }
    }
  }
}

TEST(GraphTest, RuntimeShapeErrorNamesNode) {
  GraphBuilder builder(13);
  builder.Input("x", onnx::TensorProto::FLOAT, {-1});
  builder.Input("shape", onnx::TensorProto::INT64, {1});
  builder.Node("Reshape", {"x", "shape"}, {"y"}, "dynamic_reshape");
  builder.Output("y");
  auto model = LoadOrDie(builder);
  auto shape = Tensor::FromVector<int64_t>({1}, {5});
  auto result = model->Run({{"x", FloatTensor({4}, {1, 2, 3, 4})}, {"shape", *shape}});
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("dynamic_reshape"));
  EXPECT_THAT(result.status().message(), HasSubstr("(Reshape)"));
}

// ---------------------------------------------------------------------------------------------
// Load-time fusion: a fused graph must compute what the unfused graph computes. Exposing an
// intermediate value as a graph output blocks fusion, which gives the reference.

std::vector<std::vector<float>> RunAll(const Model& model,
                                       std::vector<std::pair<std::string, Tensor>> inputs) {
  auto outputs = model.Run(inputs);
  EXPECT_TRUE(outputs.ok()) << outputs.status();
  std::vector<std::vector<float>> values;
  if (outputs.ok()) {
    for (auto& [name, tensor] : *outputs) values.push_back(Values(tensor));
  }
  return values;
}

void BuildConvChain(GraphBuilder& builder, bool expose_intermediate) {
  builder.Input("x", onnx::TensorProto::FLOAT, {1, 4, 6, 6});
  builder.FloatInitializer("w", {4, 4, 3, 3}, RandomFloats(144, 11));
  builder.FloatInitializer("gamma", {4}, {1.5f, 0.5f, -1.0f, 2.0f});
  builder.FloatInitializer("beta", {4}, {0.1f, -0.2f, 0.3f, 0.0f});
  builder.FloatInitializer("mean", {4}, {0.05f, -0.1f, 0.2f, 0.0f});
  builder.FloatInitializer("var", {4}, {1.0f, 0.5f, 2.0f, 0.25f});
  builder.FloatInitializer("three", {}, {3.0f}).FloatInitializer("six", {}, {6.0f});
  builder.FloatInitializer("scale", {1, 4, 1, 1}, {0.5f, 2.0f, 1.0f, -1.0f});
  auto& conv = builder.Node("Conv", {"x", "w"}, {"c"});
  SetInts(conv, "pads", {1, 1, 1, 1});
  builder.Node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"bn"});
  builder.Node("Add", {"bn", "three"}, {"shifted"});
  auto& clip = builder.Node("Clip", {"shifted"}, {"clipped"});
  SetFloat(clip, "min", 0.0f);
  SetFloat(clip, "max", 6.0f);
  builder.Node("Mul", {"bn", "clipped"}, {"product"});
  builder.Node("Div", {"product", "six"}, {"hswish"});
  builder.Node("Mul", {"scale", "hswish"}, {"y"});  // constant first: fused as commutative
  builder.Output("y");
  if (expose_intermediate) builder.Output("bn");
}

TEST(FusionTest, ConvBatchNormHardSwishScaleMatchesUnfused) {
  GraphBuilder fused_builder(9), plain_builder(9);
  BuildConvChain(fused_builder, false);
  BuildConvChain(plain_builder, true);
  auto fused = LoadOrDie(fused_builder);
  auto plain = LoadOrDie(plain_builder);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(fused->step_count(), 1u);  // everything folded into the Conv
  EXPECT_GT(plain->step_count(), 2u);
  Tensor x = FloatTensor({1, 4, 6, 6}, RandomFloats(144, 12));
  auto want = RunAll(*plain, {{"x", x}});
  auto got = RunAll(*fused, {{"x", x}});
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(want.size(), 2u);
  ExpectNear(got[0], want[0], 1e-5f);
}

void BuildLayerNormGelu(GraphBuilder& builder, int elem_type, bool expose) {
  builder.Input("x", elem_type, {2, 8});
  auto scalar = [&](const std::string& name, double value) {
    auto* tensor = builder.proto().mutable_graph()->add_initializer();
    tensor->set_name(name);
    tensor->set_data_type(elem_type);
    if (elem_type == onnx::TensorProto::DOUBLE) {
      tensor->add_double_data(value);
    } else {
      tensor->add_float_data(static_cast<float>(value));
    }
  };
  scalar("two", 2.0);
  scalar("eps", 1e-5);
  scalar("sqrt2", std::sqrt(2.0));
  scalar("one", 1.0);
  scalar("half", 0.5);
  auto& mean = builder.Node("ReduceMean", {"x"}, {"mean"});
  SetInts(mean, "axes", {-1});
  builder.Node("Sub", {"x", "mean"}, {"centered"});
  builder.Node("Pow", {"centered", "two"}, {"squared"});
  auto& variance = builder.Node("ReduceMean", {"squared"}, {"variance"});
  SetInts(variance, "axes", {-1});
  builder.Node("Add", {"variance", "eps"}, {"variance_eps"});
  builder.Node("Sqrt", {"variance_eps"}, {"deviation"});
  builder.Node("Div", {"centered", "deviation"}, {"normal"});
  builder.Node("Div", {"normal", "sqrt2"}, {"scaled"});
  builder.Node("Erf", {"scaled"}, {"erf"});
  builder.Node("Add", {"erf", "one"}, {"erf1"});
  builder.Node("Mul", {"normal", "erf1"}, {"gelu2"});
  builder.Node("Mul", {"gelu2", "half"}, {"y"});
  builder.Output("y");
  if (expose) builder.Output("centered").Output("erf");
}

TEST(FusionTest, LayerNormAndGeluPatternsMatchUnfused) {
  GraphBuilder fused_builder(13), plain_builder(13);
  BuildLayerNormGelu(fused_builder, onnx::TensorProto::FLOAT, false);
  BuildLayerNormGelu(plain_builder, onnx::TensorProto::FLOAT, true);
  auto fused = LoadOrDie(fused_builder);
  auto plain = LoadOrDie(plain_builder);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(fused->step_count(), 2u);  // LayerNormalization, Gelu
  Tensor x = FloatTensor({2, 8}, RandomFloats(16, 13));
  auto got = RunAll(*fused, {{"x", x}});
  auto want = RunAll(*plain, {{"x", x}});
  ASSERT_FALSE(got.empty());
  ASSERT_FALSE(want.empty());
  ExpectNear(got[0], want[0], 1e-5f);
  // Independent reference for row 0.
  const std::vector<float> values = Values(x);
  double mean = 0, var = 0;
  for (int i = 0; i < 8; ++i) mean += values[i] / 8.0;
  for (int i = 0; i < 8; ++i) var += (values[i] - mean) * (values[i] - mean) / 8.0;
  for (int i = 0; i < 8; ++i) {
    const double n = (values[i] - mean) / std::sqrt(var + 1e-5);
    EXPECT_NEAR(got[0][i], 0.5 * n * (1 + std::erf(n / std::sqrt(2.0))), 1e-5);
  }
}

TEST(FusionTest, FusedKernelThatRefusesTypeFallsBackToOriginalNodes) {
  GraphBuilder builder(13);
  BuildLayerNormGelu(builder, onnx::TensorProto::DOUBLE, false);
  auto model = LoadOrDie(builder);  // the fused LayerNormalization is float-only
  ASSERT_NE(model, nullptr);
  EXPECT_GT(model->step_count(), 2u);
  std::vector<double> values = {1, 2, 3, 4, 5, 6, 7, 8, -1, 0, 1, 0, -1, 0, 1, 0};
  auto x = Tensor::FromVector<double>({2, 8}, values);
  auto outputs = model->Run({{"x", *x}});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const double* y = (*outputs)[0].second.data<double>();
  double mean = 4.5, var = 5.25;
  const double n = (1 - mean) / std::sqrt(var + 1e-5);
  EXPECT_NEAR(y[0], 0.5 * n * (1 + std::erf(n / std::sqrt(2.0))), 1e-9);
}

TEST(FusionTest, MatMulBiasAddFusesWhenBiasIsFirst) {
  GraphBuilder builder(13);
  builder.Input("a", onnx::TensorProto::FLOAT, {3, 4});
  builder.FloatInitializer("b", {4, 2}, RandomFloats(8, 21));
  builder.FloatInitializer("bias", {2}, {0.5f, -0.5f});
  builder.Node("MatMul", {"a", "b"}, {"ab"});
  builder.Node("Add", {"bias", "ab"}, {"y"});
  builder.Node("Relu", {"y"}, {"z"});
  builder.Output("z");
  auto model = LoadOrDie(builder);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->step_count(), 1u);
  std::vector<float> a = RandomFloats(12, 22), b = RandomFloats(8, 21);
  Tensor z = RunOne(*model, {{"a", FloatTensor({3, 4}, a)}});
  std::vector<float> want;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      float sum = j == 0 ? 0.5f : -0.5f;
      for (int k = 0; k < 4; ++k) sum += a[i * 4 + k] * b[k * 2 + j];
      want.push_back(std::max(sum, 0.0f));
    }
  }
  ExpectNear(Values(z), want, 1e-5f);
}

TEST(LoadTest, CorruptedModelsFailCleanlyOrRun) {
  // Byte flips in a valid model must give an error or a model that runs; never a crash. (The
  // sanitizer build turns memory errors here into failures.)
  GraphBuilder builder(13);
  BuildConvChain(builder, false);
  const std::string original = builder.Bytes();
  std::mt19937 generator(1234);
  int loaded = 0;
  for (int round = 0; round < 300; ++round) {
    std::string bytes = original;
    const int flips = 1 + round % 4;
    for (int f = 0; f < flips; ++f) {
      const size_t at = generator() % bytes.size();
      bytes[at] = static_cast<char>(bytes[at] ^ (1u << (generator() % 8)));
    }
    auto model = Model::Load(AsBytes(bytes));
    if (!model.ok()) continue;
    ++loaded;
    for (const TensorSpec& spec : (*model)->inputs()) {
      std::vector<int64_t> shape = spec.shape;
      for (int64_t& d : shape) d = d < 0 ? 1 : std::min<int64_t>(d, 64);
      auto tensor = Tensor::Create(spec.dtype, shape);
      if (!tensor.ok()) continue;
      (void)(*model)->Run({{spec.name, *tensor}});
    }
  }
  EXPECT_GT(loaded, 0);
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
