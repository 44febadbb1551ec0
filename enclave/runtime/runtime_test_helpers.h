// Helpers shared by the runtime's test files: loading models built with GraphBuilder, running
// them, comparing float results, and a small fusable Conv model.
// Threading: plain functions; gtest assertions report on the calling thread's test.
#pragma once

#include <cmath>
#include <memory>
#include <string>
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
