// Reductions and normalisation of the CUDA operator table: the Reduce* family, global pooling,
// Softmax and LogSoftmax, LayerNormalization and inference BatchNormalization.
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Reduces float `x` over `axes` (normalised, sorted) into a new output.
absl::Status ReduceInto(DeviceCall& call, ReduceOp op, const Tensor& x,
                        const std::vector<bool>& reduce_axis, bool keep_dims, int output) {
  RETURN_IF_ERROR(CheckRank(x.rank()));
  std::vector<int64_t> out_shape, kept_dims, kept_strides, reduced_dims, reduced_strides;
  const std::vector<int64_t> strides = DenseStrides(x.shape());
  for (int d = 0; d < x.rank(); ++d) {
    if (reduce_axis[d]) {
      if (keep_dims) out_shape.push_back(1);
      reduced_dims.push_back(x.dim(d));
      reduced_strides.push_back(strides[d]);
    } else {
      out_shape.push_back(x.dim(d));
      kept_dims.push_back(x.dim(d));
      kept_strides.push_back(strides[d]);
    }
  }
  ASSIGN_OR_RETURN(Tensor y, call.Output(output, DataType::kFloat, out_shape));
  StridedIndex kept, reduced;
  kept.rank = static_cast<int>(kept_dims.size());
  for (int d = 0; d < kept.rank; ++d) {
    kept.dims[d] = kept_dims[d];
    kept.strides[0][d] = kept_strides[d];
  }
  reduced.rank = static_cast<int>(reduced_dims.size());
  for (int d = 0; d < reduced.rank; ++d) {
    reduced.dims[d] = reduced_dims[d];
    reduced.strides[0][d] = reduced_strides[d];
  }
  return CudaStatus(LaunchReduce(op, Ptr<float>(x), Ptr<float>(y), kept, reduced, call.stream()),
                    "reduce kernel");
}

DeviceFactory ReduceFactory(ReduceOp op, int axes_input_since) {
  return [op, axes_input_since](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    ASSIGN_OR_RETURN(int64_t keep_dims, node.Int("keepdims", 1));
    ASSIGN_OR_RETURN(int64_t noop_with_empty_axes, node.Int("noop_with_empty_axes", 0));
    const bool axes_input = node.since_version() >= axes_input_since;
    std::vector<int64_t> attribute_axes;
    if (!axes_input) {
      ASSIGN_OR_RETURN(attribute_axes, node.Ints("axes", std::vector<int64_t>{}));
    }
    return Spec(
        [op, keep_dims, noop_with_empty_axes, axes_input,
         attribute_axes](DeviceCall& call) -> absl::Status {
          const Tensor& x = call.in[0];
          std::vector<int64_t> axes = attribute_axes;
          if (axes_input && call.present.size() > 1 && call.present[1]) {
            axes = HostInts(call.in[1]);
          }
          std::vector<bool> reduce_axis(x.rank(), axes.empty());
          if (axes.empty() && noop_with_empty_axes != 0) {
            reduce_axis.assign(x.rank(), false);
          }
          for (int64_t axis : axes) {
            ASSIGN_OR_RETURN(int normalized, runtime::NormalizeAxis(axis, x.rank()));
            reduce_axis[normalized] = true;
          }
          return ReduceInto(call, op, x, reduce_axis, keep_dims != 0, 0);
        },
        {1});
  };
}

DeviceFactory GlobalPoolFactory(ReduceOp op) {
  return [op](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    return Spec([op](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
      std::vector<bool> reduce_axis(x.rank(), true);
      reduce_axis[0] = reduce_axis[1] = false;
      return ReduceInto(call, op, x, reduce_axis, true, 0);
    });
  };
}

DeviceFactory SoftmaxFactory(bool log) {
  return [log](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    const bool flatten = node.since_version() < 13;
    ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", flatten ? 1 : -1));
    return Spec([log, flatten, axis](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
      if (x.rank() == 0) {
        return CudaStatus(LaunchSoftmax(Ptr<float>(x), Ptr<float>(y), 1, 1, 1, log, call.stream()),
                          "Softmax kernel");
      }
      ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
      int64_t outer = 1, middle = 1, inner = 1;
      for (int d = 0; d < x.rank(); ++d) {
        if (d < a) {
          outer *= x.dim(d);
        } else if (d == a || flatten) {
          middle *= x.dim(d);
        } else {
          inner *= x.dim(d);
        }
      }
      return CudaStatus(
          LaunchSoftmax(Ptr<float>(x), Ptr<float>(y), outer, middle, inner, log, call.stream()),
          "Softmax kernel");
    });
  };
}

// Expands a per-feature vector (1 or row_size elements) to row_size elements on the device.
absl::StatusOr<Tensor> FeatureVector(DeviceCall& call, const Tensor& vector, int64_t row_size) {
  if (vector.count() == row_size) return vector;
  if (vector.count() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a scale or bias of ", vector.count(), " elements for rows of ", row_size));
  }
  ASSIGN_OR_RETURN(Tensor expanded, call.run.NewTensor(DataType::kFloat, {row_size}));
  StridedIndex index;
  index.rank = 1;
  index.dims[0] = row_size;
  index.strides[0][0] = 0;
  index.strides[2][0] = 1;
  RETURN_IF_ERROR(
      CudaStatus(LaunchStridedCopy(vector.raw_data(), expanded.raw_data(), 4, index, call.stream()),
                 "broadcast copy"));
  return expanded;
}

absl::StatusOr<std::optional<DeviceSpec>> MakeLayerNorm(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;
  for (int i = 0; i < node.input_count(); ++i) {
    if (node.has_input(i) && !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", -1));
  ASSIGN_OR_RETURN(float epsilon, node.Float("epsilon", 1e-5f));
  return Spec([axis, epsilon](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
    int64_t rows = 1, row_size = 1;
    for (int d = 0; d < x.rank(); ++d) (d < a ? rows : row_size) *= x.dim(d);
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
    ASSIGN_OR_RETURN(Tensor scale, FeatureVector(call, call.in[1], row_size));
    std::optional<Tensor> bias;
    if (call.present.size() > 2 && call.present[2]) {
      ASSIGN_OR_RETURN(bias, FeatureVector(call, call.in[2], row_size));
    }
    return CudaStatus(
        LaunchLayerNorm(Ptr<float>(x), Ptr<float>(scale), bias ? Ptr<float>(*bias) : nullptr,
                        Ptr<float>(y), rows, row_size, epsilon, call.stream()),
        "LayerNorm kernel");
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeBatchNorm(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;
  for (int i = 0; i < 5; ++i) {
    if (!node.has_input(i) || !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t training, node.Int("training_mode", 0));
  if (training != 0) return std::nullopt;
  ASSIGN_OR_RETURN(float epsilon, node.Float("epsilon", 1e-5f));
  return Spec([epsilon](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    if (x.rank() < 2) return absl::InvalidArgumentError("BatchNormalization needs rank >= 2");
    const int64_t channels = x.dim(1);
    for (int i = 1; i < 5; ++i) {
      if (call.in[i].count() != channels) {
        return absl::InvalidArgumentError("BatchNormalization parameter size differs from C");
      }
    }
    int64_t inner = 1;
    for (int d = 2; d < x.rank(); ++d) inner *= x.dim(d);
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
    return CudaStatus(LaunchBatchNorm(Ptr<float>(x), Ptr<float>(call.in[1]), Ptr<float>(call.in[2]),
                                      Ptr<float>(call.in[3]), Ptr<float>(call.in[4]), Ptr<float>(y),
                                      x.dim(0), channels, inner, epsilon, call.stream()),
                      "BatchNormalization kernel");
  });
}

}  // namespace

void AddReduceOps(DeviceTable& table) {
  table["GlobalAveragePool"] = GlobalPoolFactory(ReduceOp::kMean);
  table["GlobalMaxPool"] = GlobalPoolFactory(ReduceOp::kMax);
  table["BatchNormalization"] = MakeBatchNorm;
  table["LayerNormalization"] = MakeLayerNorm;
  table["Softmax"] = SoftmaxFactory(false);
  table["LogSoftmax"] = SoftmaxFactory(true);
  table["ReduceSum"] = ReduceFactory(ReduceOp::kSum, 13);
  table["ReduceMean"] = ReduceFactory(ReduceOp::kMean, 18);
  table["ReduceMax"] = ReduceFactory(ReduceOp::kMax, 18);
  table["ReduceMin"] = ReduceFactory(ReduceOp::kMin, 18);
  table["ReduceProd"] = ReduceFactory(ReduceOp::kProd, 18);
  table["ReduceL1"] = ReduceFactory(ReduceOp::kL1, 18);
  table["ReduceL2"] = ReduceFactory(ReduceOp::kL2, 18);
  table["ReduceSumSquare"] = ReduceFactory(ReduceOp::kSumSquare, 18);
  table["ReduceLogSum"] = ReduceFactory(ReduceOp::kLogSum, 18);
  table["ReduceLogSumExp"] = ReduceFactory(ReduceOp::kLogSumExp, 18);
}

}  // namespace cloister::gpu::cuda_ops_internal
