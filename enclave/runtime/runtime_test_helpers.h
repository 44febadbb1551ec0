// Helpers shared by the runtime's test files: loading models built with GraphBuilder, running
// them, comparing float results, and a small fusable Conv model.
// Threading: plain functions; gtest assertions report on the calling thread's test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "gtest/gtest.h"

namespace cloister::runtime {

inline std::unique_ptr<Model> LoadOrDie(const GraphBuilder& builder) {
  std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

inline absl::Status LoadError(const GraphBuilder& builder) {
  std::string bytes = builder.Bytes();
  auto model = Model::Load(AsBytes(bytes));
  return model.ok() ? absl::OkStatus() : model.status();
}

inline Tensor FloatTensor(std::vector<int64_t> shape, std::vector<float> values) {
  auto tensor = Tensor::FromVector<float>(std::move(shape), values);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return std::move(tensor).value();
}

inline std::vector<float> Values(const Tensor& tensor) {
  const float* data = tensor.data<float>();
  return std::vector<float>(data, data + tensor.count());
}

inline Tensor RunOne(const Model& model, std::vector<std::pair<std::string, Tensor>> inputs) {
  auto outputs = model.Run(inputs);
  EXPECT_TRUE(outputs.ok()) << outputs.status();
  if (!outputs.ok() || outputs->empty()) return Tensor();
  return (*outputs)[0].second;
}

inline void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                       float tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance + tolerance * std::fabs(want[i])) << "element " << i;
  }
}

// Runs the ONNX model `bytes` loaded with LoadOptions::threads 1 and 2 on the same inputs and
// expects every output the same: float outputs within `tolerance` (absolute) element by element,
// other types byte for byte. The intra-op splits must not change what a run computes.
inline void ExpectSameWithOneAndTwoThreads(
    std::string_view bytes, const std::vector<std::pair<std::string, Tensor>>& inputs,
    float tolerance) {
  LoadOptions one_thread, two_threads;
  one_thread.threads = 1;
  two_threads.threads = 2;
  auto one = Model::Load(AsBytes(bytes), one_thread);
  auto two = Model::Load(AsBytes(bytes), two_threads);
  ASSERT_TRUE(one.ok() && two.ok()) << one.status() << two.status();
  auto want = (*one)->Run(inputs);
  auto got = (*two)->Run(inputs);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  ASSERT_EQ(want->size(), got->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tensor& a = (*want)[o].second;
    const Tensor& b = (*got)[o].second;
    SCOPED_TRACE("output " + (*want)[o].first);
    ASSERT_EQ(a.shape(), b.shape());
    ASSERT_EQ(a.dtype(), b.dtype());
    if (a.dtype() != DataType::kFloat) {
      EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.size()));
      continue;
    }
    float worst = 0;
    for (int64_t i = 0; i < a.count(); ++i) {
      worst = std::max(worst, std::abs(a.data<float>()[i] - b.data<float>()[i]));
    }
    EXPECT_LE(worst, tolerance);
  }
}

// Adds Gelu written out as exporters write it, y = x * (1 + erf(x / sqrt 2)) * 0.5 (load-time
// fusion turns it into one Gelu), with its constants named after `y`.
inline void AddWrittenOutGelu(GraphBuilder& builder, const std::string& x, const std::string& y) {
  builder.FloatInitializer(y + "_sqrt2", {}, {1.41421356f});
  builder.FloatInitializer(y + "_one", {}, {1.0f});
  builder.FloatInitializer(y + "_half", {}, {0.5f});
  builder.Node("Div", {x, y + "_sqrt2"}, {y + "_scaled"});
  builder.Node("Erf", {y + "_scaled"}, {y + "_erf"});
  builder.Node("Add", {y + "_erf", y + "_one"}, {y + "_erf1"});
  builder.Node("Mul", {x, y + "_erf1"}, {y + "_gated"});
  builder.Node("Mul", {y + "_gated", y + "_half"}, {y});
}

// Conv, BatchNormalization, a HardSwish written out and a constant scale: a chain that load-time
// fusion turns into one kernel. `expose_intermediate` also makes the BatchNormalization's output
// a graph output, which blocks fusion and so gives the unfused reference.
inline void BuildConvChain(GraphBuilder& builder, bool expose_intermediate) {
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

}  // namespace cloister::runtime
