// Shape and data movement operators of the CUDA operator table: strided copies (Transpose,
// Concat, Split, Slice, Expand), Gather and Pad on the device; views (Reshape, Flatten,
// Squeeze, Unsqueeze, Identity, Dropout), shape queries (host outputs) and If.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
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
using runtime::KernelContext;
using runtime::NodeContext;
using runtime::Tensor;

// ---------------------------------------------------------------------------------------------
// Data movement.

absl::StatusOr<std::optional<DeviceSpec>> MakeTranspose(NodeContext& node) {
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, node.Ints("perm", std::vector<int64_t>{}));
  return Spec([perm](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    RETURN_IF_ERROR(CheckRank(x.rank()));
    std::vector<int64_t> order = perm;
    if (order.empty()) {
      for (int d = x.rank() - 1; d >= 0; --d) order.push_back(d);
    }
    if (static_cast<int>(order.size()) != x.rank()) {
      return absl::InvalidArgumentError("perm does not match the input rank");
    }
    const std::vector<int64_t> strides = DenseStrides(x.shape());
    std::vector<int64_t> shape(x.rank());
    StridedIndex index;
    index.rank = x.rank();
    for (int d = 0; d < x.rank(); ++d) {
      if (order[d] < 0 || order[d] >= x.rank()) {
        return absl::InvalidArgumentError("perm holds an axis out of range");
      }
      shape[d] = x.dim(order[d]);
      index.dims[d] = shape[d];
      index.strides[0][d] = strides[order[d]];
    }
    const std::vector<int64_t> out_strides = DenseStrides(shape);
    for (int d = 0; d < x.rank(); ++d) index.strides[2][d] = out_strides[d];
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
    return CudaStatus(
        LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
        "Transpose kernel");
  });
}

// Copies `x` into the block of `out` starting at `begin` along `axis` (same other dims).
absl::Status CopyIntoAxis(DeviceCall& call, const Tensor& x, Tensor& out, int axis, int64_t begin) {
  RETURN_IF_ERROR(CheckRank(x.rank()));
  const std::vector<int64_t> in_strides = DenseStrides(x.shape());
  const std::vector<int64_t> out_strides = DenseStrides(out.shape());
  StridedIndex index;
  index.rank = x.rank();
  for (int d = 0; d < x.rank(); ++d) {
    index.dims[d] = x.dim(d);
    index.strides[0][d] = in_strides[d];
    index.strides[2][d] = out_strides[d];
  }
  index.offsets[2] = begin * out_strides[axis];
  return CudaStatus(
      LaunchStridedCopy(x.raw_data(), out.raw_data(), SizeOf(x), index, call.stream()),
      "Concat kernel");
}

absl::StatusOr<std::optional<DeviceSpec>> MakeConcat(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 1));
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  return Spec([axis](DeviceCall& call) -> absl::Status {
    const Tensor& first = call.in[0];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, first.rank()));
    std::vector<int64_t> shape = first.shape();
    shape[a] = 0;
    for (size_t i = 0; i < call.in.size(); ++i) {
      const Tensor& x = call.in[i];
      if (x.rank() != first.rank()) return absl::InvalidArgumentError("Concat ranks differ");
      for (int d = 0; d < x.rank(); ++d) {
        if (d != a && x.dim(d) != first.dim(d)) {
          return absl::InvalidArgumentError("Concat inputs differ outside the axis");
        }
      }
      shape[a] += x.dim(a);
    }
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, first.dtype(), shape));
    int64_t begin = 0;
    for (const Tensor& x : call.in) {
      if (x.count() > 0) RETURN_IF_ERROR(CopyIntoAxis(call, x, y, a, begin));
      begin += x.dim(a);
    }
    return absl::OkStatus();
  });
}

// Copies the block [begin, begin + out dim) of `x` along `axis` into a new output.
absl::Status SliceAxis(DeviceCall& call, const Tensor& x, int axis, int64_t begin, int64_t count,
                       int output) {
  std::vector<int64_t> shape = x.shape();
  shape[axis] = count;
  ASSIGN_OR_RETURN(Tensor y, call.Output(output, x.dtype(), shape));
  const std::vector<int64_t> in_strides = DenseStrides(x.shape());
  const std::vector<int64_t> out_strides = DenseStrides(shape);
  StridedIndex index;
  index.rank = x.rank();
  for (int d = 0; d < x.rank(); ++d) {
    index.dims[d] = shape[d];
    index.strides[0][d] = in_strides[d];
    index.strides[2][d] = out_strides[d];
  }
  index.offsets[0] = begin * in_strides[axis];
  return CudaStatus(LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
                    "Split kernel");
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSplit(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 0));
  std::vector<int64_t> attribute_split;
  if (node.since_version() < 13) {
    ASSIGN_OR_RETURN(attribute_split, node.Ints("split", std::vector<int64_t>{}));
  }
  const int outputs = node.output_count();
  return Spec(
      [axis, attribute_split, outputs](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
        std::vector<int64_t> split = attribute_split;
        if (call.present.size() > 1 && call.present[1]) split = HostInts(call.in[1]);
        const int64_t total = x.dim(a);
        if (split.empty()) {
          // Equal parts, the last one smaller when the axis does not divide (Split-18).
          const int64_t part = (total + outputs - 1) / outputs;
          for (int i = 0; i < outputs; ++i) {
            split.push_back(std::max<int64_t>(0, std::min(part, total - part * i)));
          }
        }
        int64_t sum = 0;
        for (int64_t s : split) sum += s;
        if (static_cast<int>(split.size()) != outputs || sum != total) {
          return absl::InvalidArgumentError("split sizes do not add up to the axis");
        }
        int64_t begin = 0;
        for (int i = 0; i < outputs; ++i) {
          RETURN_IF_ERROR(SliceAxis(call, x, a, begin, split[i], i));
          begin += split[i];
        }
        return absl::OkStatus();
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSlice(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  const bool attributes = node.since_version() < 10;
  std::vector<int64_t> attr_starts, attr_ends, attr_axes;
  if (attributes) {
    ASSIGN_OR_RETURN(attr_starts, node.Ints("starts"));
    ASSIGN_OR_RETURN(attr_ends, node.Ints("ends"));
    ASSIGN_OR_RETURN(attr_axes, node.Ints("axes", std::vector<int64_t>{}));
  }
  return Spec(
      [attributes, attr_starts, attr_ends, attr_axes](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        std::vector<int64_t> starts = attr_starts, ends = attr_ends, axes = attr_axes, steps;
        auto present = [&](size_t i) { return call.present.size() > i && call.present[i]; };
        if (!attributes) {
          starts = HostInts(call.in[1]);
          ends = HostInts(call.in[2]);
          if (present(3)) axes = HostInts(call.in[3]);
          if (present(4)) steps = HostInts(call.in[4]);
        }
        if (axes.empty()) {
          for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
        }
        if (steps.empty()) steps.assign(starts.size(), 1);
        if (ends.size() != starts.size() || axes.size() != starts.size() ||
            steps.size() != starts.size()) {
          return absl::InvalidArgumentError("Slice starts, ends, axes and steps differ in length");
        }
        std::vector<int64_t> begin(x.rank(), 0), step(x.rank(), 1), shape = x.shape();
        for (size_t i = 0; i < starts.size(); ++i) {
          ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axes[i], x.rank()));
          const int64_t dim = x.dim(a);
          if (steps[i] == 0) return absl::InvalidArgumentError("Slice step is 0");
          int64_t start = starts[i], end = ends[i];
          if (start < 0) start += dim;
          if (end < 0) end += dim;
          if (steps[i] > 0) {
            start = std::clamp<int64_t>(start, 0, dim);
            end = std::clamp<int64_t>(end, 0, dim);
          } else {
            start = std::clamp<int64_t>(start, 0, dim - 1);
            end = std::clamp<int64_t>(end, -1, dim - 1);
          }
          int64_t count = 0;
          if (steps[i] > 0 && end > start) count = (end - start + steps[i] - 1) / steps[i];
          if (steps[i] < 0 && start > end) count = (start - end - steps[i] - 1) / (-steps[i]);
          begin[a] = start;
          step[a] = steps[i];
          shape[a] = count;
        }
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        const std::vector<int64_t> in_strides = DenseStrides(x.shape());
        const std::vector<int64_t> out_strides = DenseStrides(shape);
        StridedIndex index;
        index.rank = x.rank();
        for (int d = 0; d < x.rank(); ++d) {
          index.dims[d] = shape[d];
          index.strides[0][d] = in_strides[d] * step[d];
          index.strides[2][d] = out_strides[d];
          index.offsets[0] += begin[d] * in_strides[d];
        }
        return CudaStatus(
            LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
            "Slice kernel");
      },
      {1, 2, 3, 4});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeGather(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 0));
  return Spec([axis](DeviceCall& call) -> absl::Status {
    const Tensor& data = call.in[0];
    const Tensor& indices = call.in[1];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, data.rank()));
    std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + a);
    shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
    shape.insert(shape.end(), data.shape().begin() + a + 1, data.shape().end());
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, data.dtype(), shape));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < a; ++d) outer *= data.dim(d);
    for (int d = a + 1; d < data.rank(); ++d) inner *= data.dim(d);
    return CudaStatus(
        LaunchGather(data.raw_data(), SizeOf(data), indices.raw_data(),
                     indices.dtype() == DataType::kInt64, outer, data.dim(a), inner,
                     indices.count(), y.raw_data(), call.run.error_flag(), call.stream()),
        "Gather kernel");
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeExpand(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  return Spec(
      [](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                         runtime::BroadcastShapes(x.shape(), HostInts(call.in[1])));
        ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex(shape, {x.shape()}));
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        return CudaStatus(
            LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
            "Expand kernel");
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakePad(NodeContext& node) {
  const DataType type = node.input(0).dtype;
  if (runtime::ElementSize(type) == 0 || runtime::ElementSize(type) > 8) return std::nullopt;
  ASSIGN_OR_RETURN(std::string mode_name, node.String("mode", "constant"));
  PadMode mode;
  if (mode_name == "constant") {
    mode = PadMode::kConstant;
  } else if (mode_name == "reflect") {
    mode = PadMode::kReflect;
  } else if (mode_name == "edge") {
    mode = PadMode::kEdge;
  } else {
    return std::nullopt;
  }
  const bool attributes = node.since_version() < 11;
  std::vector<int64_t> attr_pads;
  float attr_value = 0.f;
  if (attributes) {
    ASSIGN_OR_RETURN(attr_pads, node.Ints("pads"));
    ASSIGN_OR_RETURN(attr_value, node.Float("value", 0.f));
    if (type != DataType::kFloat) return std::nullopt;
  }
  return Spec(
      [mode, attributes, attr_pads, attr_value](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        auto present = [&](size_t i) { return call.present.size() > i && call.present[i]; };
        std::vector<int64_t> pads = attributes ? attr_pads : HostInts(call.in[1]);
        unsigned char constant[8] = {};
        if (attributes) {
          std::memcpy(constant, &attr_value, sizeof(float));
        } else if (present(2) && call.in[2].count() > 0) {
          std::memcpy(constant, call.in[2].raw_data(), runtime::ElementSize(x.dtype()));
        }
        std::vector<int64_t> axes;
        if (!attributes && present(3)) {
          for (int64_t axis : HostInts(call.in[3])) {
            ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
            axes.push_back(a);
          }
        } else {
          for (int d = 0; d < x.rank(); ++d) axes.push_back(d);
        }
        if (pads.size() != 2 * axes.size()) {
          return absl::InvalidArgumentError("Pad's pads have the wrong length");
        }
        std::vector<int64_t> begin(x.rank(), 0), shape = x.shape();
        for (size_t i = 0; i < axes.size(); ++i) {
          begin[axes[i]] = pads[i];
          shape[axes[i]] += pads[i] + pads[i + axes.size()];
          if (shape[axes[i]] < 0) return absl::InvalidArgumentError("Pad crops below zero");
        }
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        const std::vector<int64_t> in_strides = DenseStrides(x.shape());
        StridedIndex index;
        index.rank = x.rank();
        for (int d = 0; d < x.rank(); ++d) {
          index.dims[d] = shape[d];
          index.strides[0][d] = in_strides[d];
        }
        return CudaStatus(LaunchPad(x.raw_data(), y.raw_data(), SizeOf(x), mode, constant, index,
                                    x.shape().data(), begin.data(), call.stream()),
                          "Pad kernel");
      },
      {1, 2, 3});
}

// ---------------------------------------------------------------------------------------------
// Views (no device work), shape queries (host outputs) and control flow.

// Output 0 as a view of input 0 with `shape` computed on the host.
using ShapeFn = std::function<absl::StatusOr<std::vector<int64_t>>(DeviceCall&)>;
std::optional<DeviceSpec> ViewSpec(ShapeFn shape_of, std::vector<int> host_inputs) {
  return Spec(
      [shape_of](DeviceCall& call) -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<int64_t> shape, shape_of(call));
        ASSIGN_OR_RETURN(int64_t count, runtime::ElementCount(shape));
        if (count != call.in[0].count()) {
          return absl::InvalidArgumentError(absl::StrCat("cannot view ",
                                                         runtime::ShapeToString(call.in[0].shape()),
                                                         " as ", runtime::ShapeToString(shape)));
        }
        call.context.SetOutput(0, call.in[0].Reshaped(std::move(shape)));
        // Optional extra outputs (Dropout's mask) are declared by the CPU factory; none here.
        return absl::OkStatus();
      },
      std::move(host_inputs));
}

absl::StatusOr<std::optional<DeviceSpec>> MakeReshape(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t allow_zero, node.Int("allowzero", 0));
  std::vector<int64_t> attr_shape;
  const bool attribute = node.since_version() < 5;
  if (attribute) {
    ASSIGN_OR_RETURN(attr_shape, node.Ints("shape"));
  }
  return ViewSpec(
      [allow_zero, attribute,
       attr_shape](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
        const Tensor& x = call.in[0];
        std::vector<int64_t> shape = attribute ? attr_shape : HostInts(call.in[1]);
        int infer = -1;
        int64_t known = 1;
        for (size_t i = 0; i < shape.size(); ++i) {
          if (shape[i] == 0 && allow_zero == 0) {
            if (static_cast<int>(i) >= x.rank()) {
              return absl::InvalidArgumentError("Reshape copies a dimension the input lacks");
            }
            shape[i] = x.dim(static_cast<int>(i));
          }
          if (shape[i] == -1) {
            if (infer >= 0) return absl::InvalidArgumentError("Reshape has two -1 dimensions");
            infer = static_cast<int>(i);
          } else if (shape[i] < 0) {
            return absl::InvalidArgumentError("Reshape has a negative dimension");
          } else {
            known *= shape[i];
          }
        }
        if (infer >= 0) {
          if (known == 0 || x.count() % known != 0) {
            return absl::InvalidArgumentError("Reshape cannot infer the -1 dimension");
          }
          shape[infer] = x.count() / known;
        }
        return shape;
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeFlatten(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 1));
  return ViewSpec(
      [axis](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
        const Tensor& x = call.in[0];
        int64_t a = axis < 0 ? axis + x.rank() : axis;
        if (a < 0 || a > x.rank()) return absl::InvalidArgumentError("Flatten axis out of range");
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < x.rank(); ++d) (d < a ? outer : inner) *= x.dim(d);
        return std::vector<int64_t>{outer, inner};
      },
      {});
}

DeviceFactory SqueezeFactory(bool unsqueeze) {
  return [unsqueeze](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    const bool attribute = node.since_version() < 13;
    std::vector<int64_t> attr_axes;
    if (attribute) {
      ASSIGN_OR_RETURN(attr_axes, node.Ints("axes", std::vector<int64_t>{}));
    }
    return ViewSpec(
        [unsqueeze, attribute,
         attr_axes](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
          const Tensor& x = call.in[0];
          std::vector<int64_t> axes = attr_axes;
          if (!attribute && call.present.size() > 1 && call.present[1]) {
            axes = HostInts(call.in[1]);
          }
          if (unsqueeze) {
            const int rank = x.rank() + static_cast<int>(axes.size());
            std::vector<bool> inserted(rank, false);
            for (int64_t axis : axes) {
              ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, rank));
              if (inserted[a]) return absl::InvalidArgumentError("Unsqueeze repeats an axis");
              inserted[a] = true;
            }
            std::vector<int64_t> shape;
            int source = 0;
            for (int d = 0; d < rank; ++d) shape.push_back(inserted[d] ? 1 : x.dim(source++));
            return shape;
          }
          std::vector<bool> removed(x.rank(), axes.empty());
          if (axes.empty()) {
            for (int d = 0; d < x.rank(); ++d) removed[d] = x.dim(d) == 1;
          }
          for (int64_t axis : axes) {
            ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
            if (x.dim(a) != 1) return absl::InvalidArgumentError("Squeeze of a dimension != 1");
            removed[a] = true;
          }
          std::vector<int64_t> shape;
          for (int d = 0; d < x.rank(); ++d) {
            if (!removed[d]) shape.push_back(x.dim(d));
          }
          return shape;
        },
        {1});
  };
}

absl::StatusOr<std::optional<DeviceSpec>> MakeIdentity(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;  // Dropout with a mask: host
  return ViewSpec(
      [](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> { return call.in[0].shape(); },
      {1, 2});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeShape(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t start, node.Int("start", 0));
  const bool has_end = node.has_attribute("end");
  ASSIGN_OR_RETURN(int64_t end, node.Int("end", 0));
  return Spec([start, has_end, end](DeviceCall& call) -> absl::Status {
    const int64_t rank = call.in[0].rank();
    auto clamp = [rank](int64_t value) {
      if (value < 0) value += rank;
      return std::clamp<int64_t>(value, 0, rank);
    };
    const int64_t first = clamp(start), last = has_end ? clamp(end) : rank;
    std::vector<int64_t> dims;
    for (int64_t d = first; d < last; ++d) dims.push_back(call.in[0].dim(static_cast<int>(d)));
    ASSIGN_OR_RETURN(Tensor shape,
                     Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
    call.context.SetOutput(0, std::move(shape));  // a host value (shape arithmetic)
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSize(NodeContext& node) {
  return Spec([](DeviceCall& call) -> absl::Status {
    ASSIGN_OR_RETURN(Tensor size, Tensor::FromVector<int64_t>({}, {call.in[0].count()}));
    call.context.SetOutput(0, std::move(size));
    return absl::OkStatus();
  });
}

// If: the condition is read on the host; the CPU kernel picks the branch, whose plan runs with
// this run's pool (so its CUDA kernels see the captured device values).
absl::StatusOr<std::optional<DeviceSpec>> MakeIf(NodeContext& node) {
  return Spec(
      [](DeviceCall& call) -> absl::Status {
        std::vector<const Tensor*> inputs;
        for (size_t i = 0; i < call.in.size(); ++i) {
          inputs.push_back(call.present[i] ? &call.in[i] : nullptr);
        }
        const int output_count = static_cast<int>(call.context.outputs().size());
        KernelContext branch(std::move(inputs), std::vector<bool>(call.in.size(), false),
                             output_count, call.context.pool());
        RETURN_IF_ERROR(call.cpu.Compute(branch));
        for (int i = 0; i < output_count; ++i) {
          call.context.SetOutput(i, std::move(branch.outputs()[i]));
        }
        return absl::OkStatus();
      },
      {0});
}

}  // namespace

void AddShapeOps(DeviceTable& table) {
  table["Transpose"] = MakeTranspose;
  table["Concat"] = MakeConcat;
  table["Split"] = MakeSplit;
  table["Slice"] = MakeSlice;
  table["Gather"] = MakeGather;
  table["Expand"] = MakeExpand;
  table["Pad"] = MakePad;
  table["Reshape"] = MakeReshape;
  table["Flatten"] = MakeFlatten;
  table["Squeeze"] = SqueezeFactory(false);
  table["Unsqueeze"] = SqueezeFactory(true);
  table["Identity"] = MakeIdentity;
  table["Dropout"] = MakeIdentity;
  table["Shape"] = MakeShape;
  table["Size"] = MakeSize;
  table["If"] = MakeIf;
}

}  // namespace cloister::gpu::cuda_ops_internal
