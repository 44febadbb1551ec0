// Run-time and graph-level tests for the enclave's inference runtime: input validation,
// concurrent runs, graph behaviour (constant folding, If, deadlines inside a step, blocked
// matrix products), load-time fusion against the unfused graph, and byte-flipped models.
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "enclave/runtime/gemm.h"
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
  // x [n, 1, 32, 32] -> Conv with 8 maps of 13x13 -> y; inside an If branch when `branched`.
  // The kernel is large so that the product, not allocating and zeroing the output, is most
  // of the step's time (with 4 maps of 5x5 the output's page faults were, once the products
  // got fast, and a stopped run could not end before half the full time).
  static GraphBuilder ConvModel(bool branched) {
    GraphBuilder builder(13);
    builder.Input("x", onnx::TensorProto::FLOAT, {-1, 1, 32, 32})
        .FloatInitializer("w", {8, 1, 13, 13}, std::vector<float>(8 * 13 * 13, 0.004f));
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
    auto stopped = model.Run(inputs, {}, Deadline::At(limited_start + full / 8, Clock::Real()));
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

// LogSoftmax of an intermediate value, whose buffer the kernel writes its output into, gives
// what it gives on a graph input (whose buffer it must leave alone).
TEST(SoftmaxTest, LogSoftmaxInPlaceOnAnIntermediateMatchesOnAnInput) {
  GraphBuilder in_place, on_input;
  in_place.Input("x", onnx::TensorProto::FLOAT, {4, 37});
  in_place.FloatInitializer("zero", {}, {0.0f});
  in_place.Node("Add", {"x", "zero"}, {"t"});
  in_place.Node("LogSoftmax", {"t"}, {"y"});
  in_place.Output("y");
  on_input.Input("x", onnx::TensorProto::FLOAT, {4, 37});
  on_input.Node("LogSoftmax", {"x"}, {"y"});
  on_input.Output("y");
  auto a = LoadOrDie(in_place);
  auto b = LoadOrDie(on_input);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  Tensor x = FloatTensor({4, 37}, RandomFloats(4 * 37, 3));
  ExpectNear(Values(RunOne(*a, {{"x", x}})), Values(RunOne(*b, {{"x", x}})), 1e-6f);
}

}  // namespace
}  // namespace cloister::runtime
