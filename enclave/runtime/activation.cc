#include "enclave/runtime/activation.h"

#include <cfloat>
#include <limits>

namespace cloister::runtime {

std::optional<Activation> Activation::FromNode(const NodeContext& node) {
  if (node.input_count() < 1 || !node.has_input(0) || node.input(0).dtype != DataType::kFloat ||
      node.output_count() != 1) {
    return std::nullopt;
  }
  const std::string& op = node.op_type();
  Activation activation;
  if (op == "Relu") {
    activation.kind = Kind::kRelu;
  } else if (op == "Sigmoid") {
    activation.kind = Kind::kSigmoid;
  } else if (op == "Tanh") {
    activation.kind = Kind::kTanh;
  } else if (op == "HardSwish") {
    activation.kind = Kind::kHardSwish;
  } else if (op == "Gelu") {
    auto approximate = node.String("approximate", "none");
    if (!approximate.ok() || *approximate != "none") return std::nullopt;
    activation.kind = Kind::kGelu;
  } else if (op == "HardSigmoid") {
    auto alpha = node.Float("alpha", 0.2f);
    auto beta = node.Float("beta", 0.5f);
    if (!alpha.ok() || !beta.ok()) return std::nullopt;
    activation = Activation{Kind::kHardSigmoid, *alpha, *beta};
  } else if (op == "LeakyRelu") {
    auto alpha = node.Float("alpha", 0.01f);
    if (!alpha.ok()) return std::nullopt;
    activation = Activation{Kind::kLeakyRelu, *alpha, 0};
  } else if (op == "Clip") {
    float low = -std::numeric_limits<float>::infinity();
    float high = std::numeric_limits<float>::infinity();
    if (node.since_version() < 11) {
      auto min_value = node.Float("min", -FLT_MAX);
      auto max_value = node.Float("max", FLT_MAX);
      if (!min_value.ok() || !max_value.ok()) return std::nullopt;
      low = *min_value;
      high = *max_value;
    } else {
      for (int i = 1; i <= 2 && i < node.input_count(); ++i) {
        if (!node.has_input(i)) continue;
        const Tensor* bound = node.constant_input(i);
        if (bound == nullptr || bound->dtype() != DataType::kFloat || bound->count() != 1) {
          return std::nullopt;
        }
        (i == 1 ? low : high) = *bound->data<float>();
      }
    }
    activation = Activation{Kind::kClip, low, high};
  } else {
    return std::nullopt;
  }
  return activation;
}

}  // namespace cloister::runtime
