// Elementwise operators of the CUDA operator table: unary functions with their attributes,
// Clip, broadcasting binary arithmetic, comparison and logic, Where, Cast and CastLike.
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_ops_internal.h"
#include "enclave/runtime/kernel.h"

namespace cloister::gpu::cuda_ops_internal {
namespace {

using runtime::DataType;
using runtime::NodeContext;
using runtime::Tensor;

DeviceFactory UnaryFactory(
    UnaryOp op, std::function<absl::Status(NodeContext&, float*, float*)> attributes = nullptr) {
  return [op, attributes](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    float alpha = 0.f, beta = 0.f;
    if (attributes) RETURN_IF_ERROR(attributes(node, &alpha, &beta));
    return Spec([op, alpha, beta](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
      return CudaStatus(
          LaunchUnary(op, alpha, beta, Ptr<float>(x), Ptr<float>(y), x.count(), call.stream()),
          "unary kernel");
    });
  };
}

DeviceFactory ClipFactory() {
  return [](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    float low = -std::numeric_limits<float>::infinity();
    float high = std::numeric_limits<float>::infinity();
    if (node.since_version() < 11) {
      ASSIGN_OR_RETURN(low, node.Float("min", low));
      ASSIGN_OR_RETURN(high, node.Float("max", high));
    }
    return Spec(
        [low, high](DeviceCall& call) -> absl::Status {
          float min_value = low, max_value = high;
          if (call.present.size() > 1 && call.present[1] && call.in[1].count() > 0) {
            min_value = call.in[1].data<float>()[0];
          }
          if (call.present.size() > 2 && call.present[2] && call.in[2].count() > 0) {
            max_value = call.in[2].data<float>()[0];
          }
          const Tensor& x = call.in[0];
          ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
          return CudaStatus(LaunchUnary(UnaryOp::kClip, min_value, max_value, Ptr<float>(x),
                                        Ptr<float>(y), x.count(), call.stream()),
                            "Clip kernel");
        },
        {1, 2});
  };
}

bool IsComparisonOp(BinaryOp op) { return op >= BinaryOp::kEqual; }

DeviceFactory BinaryFactory(BinaryOp op) {
  return [op](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (node.input_count() != 2 || !node.has_input(1)) return std::nullopt;
    const DataType a = node.input(0).dtype, b = node.input(1).dtype;
    if (a != b) return std::nullopt;
    const bool logic = op == BinaryOp::kAnd || op == BinaryOp::kOr || op == BinaryOp::kXor;
    bool supported = a == DataType::kFloat || a == DataType::kDouble || a == DataType::kInt32 ||
                     a == DataType::kInt64;
    if (op == BinaryOp::kPow || op == BinaryOp::kPRelu) supported = a == DataType::kFloat;
    if (logic) supported = a == DataType::kBool;
    if (op == BinaryOp::kEqual && a == DataType::kBool) supported = true;
    if (!supported) return std::nullopt;
    return Spec([op](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      const Tensor& y = call.in[1];
      ASSIGN_OR_RETURN(std::vector<int64_t> shape, runtime::BroadcastShapes(x.shape(), y.shape()));
      ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex(shape, {x.shape(), y.shape()}));
      const DataType out_type = IsComparisonOp(op) ? DataType::kBool : x.dtype();
      ASSIGN_OR_RETURN(Tensor out, call.Output(0, out_type, shape));
      return CudaStatus(LaunchBinary(op, ToDevice(x.dtype()), x.raw_data(), y.raw_data(),
                                     out.raw_data(), index, call.stream()),
                        "binary kernel");
    });
  };
}

absl::StatusOr<std::optional<DeviceSpec>> MakeWhere(NodeContext& node) {
  const DataType type = node.input(1).dtype;
  if (runtime::ElementSize(type) == 0) return std::nullopt;
  return Spec([](DeviceCall& call) -> absl::Status {
    const Tensor& cond = call.in[0];
    const Tensor& x = call.in[1];
    const Tensor& y = call.in[2];
    ASSIGN_OR_RETURN(std::vector<int64_t> xy, runtime::BroadcastShapes(x.shape(), y.shape()));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, runtime::BroadcastShapes(cond.shape(), xy));
    ASSIGN_OR_RETURN(StridedIndex index,
                     BroadcastIndex(shape, {cond.shape(), x.shape(), y.shape()}));
    ASSIGN_OR_RETURN(Tensor out, call.Output(0, x.dtype(), shape));
    return CudaStatus(
        LaunchWhere(Ptr<bool>(cond), x.raw_data(), y.raw_data(), out.raw_data(),
                    static_cast<int>(runtime::ElementSize(x.dtype())), index, call.stream()),
        "Where kernel");
  });
}

DeviceFactory CastFactory(bool like) {
  return [like](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    const DataType from = node.input(0).dtype;
    const DataType to = node.outputs()[0].dtype;  // the CPU factory declared it
    if (runtime::ElementSize(from) == 0 || runtime::ElementSize(to) == 0) return std::nullopt;
    return Spec([from, to](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, to, x.shape()));
      return CudaStatus(LaunchCast(ToDevice(from), ToDevice(to), x.raw_data(), y.raw_data(),
                                   x.count(), call.stream()),
                        "Cast kernel");
    });
  };
}

struct AttrUnary {
  const char* alpha_name;
  float alpha;
  const char* beta_name;
  float beta;
};

DeviceFactory UnaryWith(UnaryOp op, AttrUnary attrs) {
  return UnaryFactory(op, [attrs](NodeContext& node, float* alpha, float* beta) -> absl::Status {
    if (attrs.alpha_name != nullptr) {
      ASSIGN_OR_RETURN(*alpha, node.Float(attrs.alpha_name, attrs.alpha));
    }
    if (attrs.beta_name != nullptr) {
      ASSIGN_OR_RETURN(*beta, node.Float(attrs.beta_name, attrs.beta));
    }
    return absl::OkStatus();
  });
}

}  // namespace

void AddElementwiseOps(DeviceTable& table) {
  const std::pair<const char*, UnaryOp> plain[] = {
      {"Relu", UnaryOp::kRelu},
      {"Neg", UnaryOp::kNeg},
      {"Abs", UnaryOp::kAbs},
      {"Sign", UnaryOp::kSign},
      {"Sigmoid", UnaryOp::kSigmoid},
      {"Tanh", UnaryOp::kTanh},
      {"Erf", UnaryOp::kErf},
      {"Sqrt", UnaryOp::kSqrt},
      {"Exp", UnaryOp::kExp},
      {"Log", UnaryOp::kLog},
      {"Sin", UnaryOp::kSin},
      {"Cos", UnaryOp::kCos},
      {"Tan", UnaryOp::kTan},
      {"Asin", UnaryOp::kAsin},
      {"Acos", UnaryOp::kAcos},
      {"Atan", UnaryOp::kAtan},
      {"Sinh", UnaryOp::kSinh},
      {"Cosh", UnaryOp::kCosh},
      {"Asinh", UnaryOp::kAsinh},
      {"Acosh", UnaryOp::kAcosh},
      {"Atanh", UnaryOp::kAtanh},
      {"Floor", UnaryOp::kFloor},
      {"Ceil", UnaryOp::kCeil},
      {"Round", UnaryOp::kRound},
      {"Reciprocal", UnaryOp::kReciprocal},
      {"Softsign", UnaryOp::kSoftsign},
      {"Softplus", UnaryOp::kSoftplus},
      {"HardSwish", UnaryOp::kHardSwish},
  };
  for (const auto& [name, op] : plain) table[name] = UnaryFactory(op);
  table["HardSigmoid"] = UnaryWith(UnaryOp::kHardSigmoid, {"alpha", 0.2f, "beta", 0.5f});
  table["LeakyRelu"] = UnaryWith(UnaryOp::kLeakyRelu, {"alpha", 0.01f, nullptr, 0.f});
  table["Elu"] = UnaryWith(UnaryOp::kElu, {"alpha", 1.f, nullptr, 0.f});
  table["Celu"] = UnaryWith(UnaryOp::kCelu, {"alpha", 1.f, nullptr, 0.f});
  table["Selu"] = UnaryWith(
      UnaryOp::kSelu, {"alpha", 1.67326319217681884765625f, "gamma", 1.05070102214813232421875f});
  table["ThresholdedRelu"] = UnaryWith(UnaryOp::kThresholdedRelu, {"alpha", 1.f, nullptr, 0.f});
  table["Gelu"] = [](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    ASSIGN_OR_RETURN(std::string approximate, node.String("approximate", "none"));
    return UnaryFactory(approximate == "tanh" ? UnaryOp::kGeluTanh : UnaryOp::kGelu)(node);
  };
  table["Clip"] = ClipFactory();
  const std::pair<const char*, BinaryOp> binary[] = {
      {"Add", BinaryOp::kAdd},
      {"Sub", BinaryOp::kSub},
      {"Mul", BinaryOp::kMul},
      {"Div", BinaryOp::kDiv},
      {"Pow", BinaryOp::kPow},
      {"PRelu", BinaryOp::kPRelu},
      {"Max", BinaryOp::kMax},
      {"Min", BinaryOp::kMin},
      {"Equal", BinaryOp::kEqual},
      {"Less", BinaryOp::kLess},
      {"Greater", BinaryOp::kGreater},
      {"LessOrEqual", BinaryOp::kLessOrEqual},
      {"GreaterOrEqual", BinaryOp::kGreaterOrEqual},
      {"And", BinaryOp::kAnd},
      {"Or", BinaryOp::kOr},
      {"Xor", BinaryOp::kXor},
  };
  for (const auto& [name, op] : binary) table[name] = BinaryFactory(op);
  table["Where"] = MakeWhere;
  table["Cast"] = CastFactory(false);
  table["CastLike"] = CastFactory(true);
}

}  // namespace cloister::gpu::cuda_ops_internal
