// Tensor-manipulation CPU kernels that cut and join: Concat, Split, Slice, Gather and
// GatherElements.
#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// Concat and Split.

class ConcatKernel : public Kernel {
 public:
  explicit ConcatKernel(int64_t axis) : axis_(axis) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& first = context.input(0);
    const int rank = first.rank();
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, rank));
    std::vector<int64_t> shape = first.shape();
    shape[axis] = 0;
    for (int i = 0; i < context.input_count(); ++i) {
      const Tensor& t = context.input(i);
      if (t.rank() != rank) return absl::InvalidArgumentError("inputs differ in rank");
      for (int d = 0; d < rank; ++d) {
        if (d != axis && t.dim(d) != first.dim(d)) {
          return absl::InvalidArgumentError(absl::StrCat("input ", i, " has shape ",
                                                         ShapeToString(t.shape()), ", input 0 ",
                                                         ShapeToString(first.shape())));
        }
      }
      shape[axis] += t.dim(axis);
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, first.dtype(), shape));
    const size_t element = ElementSize(first.dtype());
    const int64_t outer = Product(shape, 0, axis);
    const int64_t inner = Product(shape, axis + 1, rank);
    const int64_t out_row = shape[axis] * inner * element;
    char* out = static_cast<char*>(y->raw_data());
    int64_t offset = 0;
    for (int i = 0; i < context.input_count(); ++i) {
      const Tensor& t = context.input(i);
      const int64_t row = t.dim(axis) * inner * element;
      const char* in = static_cast<const char*>(t.raw_data());
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(out + o * out_row + offset, in + o * row, row);
      }
      offset += row;
    }
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeConcat(NodeContext& context) {
  if (context.input_count() < 1) return absl::InvalidArgumentError("needs at least one input");
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", context.since_version() < 4 ? 1 : -999999));
  if (axis == -999999) return absl::InvalidArgumentError("missing attribute 'axis'");
  bool ranks_known = true;
  for (int i = 0; i < context.input_count(); ++i) {
    if (!context.has_input(i)) return absl::InvalidArgumentError("inputs cannot be absent");
    RETURN_IF_ERROR(RequireType(context, i, IsMovable));
    RETURN_IF_ERROR(RequireSameType(context, 0, i));
    ranks_known = ranks_known && context.input(i).rank_known;
  }
  const DataType dtype = context.input(0).dtype;
  if (ranks_known) {
    const int rank = context.input(0).rank();
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, rank));
    std::vector<int64_t> dims = context.input(0).dims;
    dims[a] = 0;
    for (int i = 0; i < context.input_count(); ++i) {
      const ValueInfo& in = context.input(i);
      if (in.rank() != rank) return absl::InvalidArgumentError("inputs differ in rank");
      for (int d = 0; d < rank; ++d) {
        if (d == a) continue;
        if (dims[d] < 0) dims[d] = in.dims[d];
        if (in.dims[d] >= 0 && dims[d] >= 0 && in.dims[d] != dims[d]) {
          return absl::InvalidArgumentError(absl::StrCat("input ", i, " has shape ",
                                                         ShapeToString(in.dims),
                                                         " which does not fit the others"));
        }
      }
      if (dims[a] >= 0) dims[a] = in.dims[a] < 0 ? -1 : dims[a] + in.dims[a];
    }
    context.SetOutput(0, dtype, dims);
  } else {
    context.SetOutputUnranked(0, dtype);
  }
  return MakeKernel<ConcatKernel>(axis);
}

class SplitKernel : public Kernel {
 public:
  SplitKernel(int64_t axis, std::vector<int64_t> split, bool split_from_input)
      : axis_(axis), split_(std::move(split)), split_from_input_(split_from_input) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, x.rank()));
    const int outputs = static_cast<int>(context.outputs().size());
    std::vector<int64_t> split = split_;
    if (split_from_input_ && context.has_input(1)) split = ToInt64Vector(context.input(1));
    const int64_t dim = x.dim(axis);
    if (split.empty()) {
      // Equal parts; with opset 18's num_outputs the last part may be smaller.
      const int64_t part = (dim + outputs - 1) / outputs;
      for (int i = 0; i < outputs; ++i) {
        split.push_back(std::max<int64_t>(0, std::min(part, dim - part * i)));
      }
      if (split_.empty() && !split_from_input_ && dim % outputs != 0 && !uneven_allowed_) {
        return absl::InvalidArgumentError(
            absl::StrCat("axis of size ", dim, " does not split into ", outputs, " equal parts"));
      }
    }
    if (static_cast<int>(split.size()) != outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("split has ", split.size(), " entries for ", outputs, " outputs"));
    }
    int64_t total = 0;
    for (int64_t s : split) {
      if (s < 0) return absl::InvalidArgumentError("split sizes must not be negative");
      total += s;
    }
    if (total != dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("split sizes sum to ", total, ", axis has ", dim));
    }
    const size_t element = ElementSize(x.dtype());
    const int64_t outer = Product(x.shape(), 0, axis);
    const int64_t inner = Product(x.shape(), axis + 1, x.rank());
    const char* in = static_cast<const char*>(x.raw_data());
    int64_t offset = 0;
    for (int i = 0; i < outputs; ++i) {
      std::vector<int64_t> shape = x.shape();
      shape[axis] = split[i];
      ASSIGN_OR_RETURN(Tensor * y, context.Output(i, x.dtype(), shape));
      const int64_t row = split[i] * inner * element;
      char* out = static_cast<char*>(y->raw_data());
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(out + o * row, in + o * dim * inner * element + offset, row);
      }
      offset += row;
    }
    return absl::OkStatus();
  }
  void AllowUneven() { uneven_allowed_ = true; }

 private:
  int64_t axis_;
  std::vector<int64_t> split_;
  bool split_from_input_;
  bool uneven_allowed_ = false;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeSplit(NodeContext& context) {
  const int version = context.since_version();
  RETURN_IF_ERROR(context.ExpectInputs(1, version >= 13 || version < 2 ? 2 : 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", 0));
  std::vector<int64_t> split;
  bool from_input = false;
  if (version >= 13 || version < 2) {
    if (context.has_input(1)) {
      RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
      if (const Tensor* constant = context.constant_input(1)) {
        split = ToInt64Vector(*constant);
      } else {
        from_input = true;
      }
    }
  }
  if (version < 13) {
    ASSIGN_OR_RETURN(std::vector<int64_t> attribute, context.Ints("split", std::vector<int64_t>{}));
    if (!attribute.empty()) split = attribute;
  }
  bool uneven = false;
  if (version >= 18) {
    if (context.has_attribute("num_outputs")) {
      ASSIGN_OR_RETURN(int64_t num_outputs, context.Int("num_outputs"));
      if (num_outputs != context.output_count()) {
        return absl::InvalidArgumentError(absl::StrCat("num_outputs is ", num_outputs,
                                                       " but the node has ", context.output_count(),
                                                       " outputs"));
      }
      if (context.has_input(1)) {
        return absl::InvalidArgumentError("num_outputs and the split input are exclusive");
      }
      uneven = true;
    } else if (!context.has_input(1)) {
      return absl::InvalidArgumentError("needs either the split input or num_outputs");
    }
  }
  if (!split.empty() && static_cast<int>(split.size()) != context.output_count()) {
    return absl::InvalidArgumentError(absl::StrCat("split has ", split.size(), " entries for ",
                                                   context.output_count(), " outputs"));
  }
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, x.rank()));
    const int outputs = context.output_count();
    const int64_t dim = x.dims[a];
    for (int i = 0; i < outputs; ++i) {
      std::vector<int64_t> dims = x.dims;
      if (!split.empty()) {
        dims[a] = split[i];
      } else if (from_input || dim < 0) {
        dims[a] = -1;
      } else {
        const int64_t part = (dim + outputs - 1) / outputs;
        dims[a] = std::max<int64_t>(0, std::min(part, dim - part * i));
      }
      context.SetOutput(i, x.dtype, dims);
    }
  } else {
    for (int i = 0; i < context.output_count(); ++i) context.SetOutputUnranked(i, x.dtype);
  }
  auto kernel = std::make_unique<SplitKernel>(axis, std::move(split), from_input);
  if (uneven) kernel->AllowUneven();
  return std::unique_ptr<Kernel>(std::move(kernel));
}

// ---------------------------------------------------------------------------------------------
// Slice.

struct SliceRange {
  int64_t start, step, count;
};

// Clamps starts/ends per ONNX rules and returns per-axis ranges for the whole input rank.
absl::StatusOr<std::vector<SliceRange>> ResolveSlice(const std::vector<int64_t>& shape,
                                                     const std::vector<int64_t>& starts,
                                                     const std::vector<int64_t>& ends,
                                                     const std::vector<int64_t>& axes_in,
                                                     const std::vector<int64_t>& steps_in) {
  const int rank = static_cast<int>(shape.size());
  if (starts.size() != ends.size()) {
    return absl::InvalidArgumentError("starts and ends differ in length");
  }
  std::vector<int64_t> axes = axes_in;
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (axes.size() != starts.size() || (!steps_in.empty() && steps_in.size() != starts.size())) {
    return absl::InvalidArgumentError("axes and steps must match starts in length");
  }
  std::vector<SliceRange> ranges(rank);
  for (int i = 0; i < rank; ++i) ranges[i] = {0, 1, shape[i]};
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axes[i], rank));
    if (seen[axis]) return absl::InvalidArgumentError("axes repeat");
    seen[axis] = true;
    const int64_t dim = shape[axis];
    const int64_t step = steps_in.empty() ? 1 : steps_in[i];
    if (step == 0) return absl::InvalidArgumentError("steps must not be 0");
    if (dim < 0) {
      ranges[axis] = {0, step, -1};
      continue;
    }
    int64_t start = starts[i], end = ends[i];
    if (start < 0) start += dim;
    if (end < 0 && end > INT64_MIN / 2) end += dim;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      count = start > end ? (start - end - step - 1) / (-step) : 0;
    }
    ranges[axis] = {start, step, count};
  }
  return ranges;
}

class SliceKernel : public Kernel {
 public:
  // Constant parameters are fixed here; the others are read from inputs 1..4.
  SliceKernel(std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> axes,
              std::vector<int64_t> steps, bool from_inputs)
      : starts_(std::move(starts)),
        ends_(std::move(ends)),
        axes_(std::move(axes)),
        steps_(std::move(steps)),
        from_inputs_(from_inputs) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> starts = starts_, ends = ends_, axes = axes_, steps = steps_;
    if (from_inputs_) {
      starts = ToInt64Vector(context.input(1));
      ends = ToInt64Vector(context.input(2));
      axes = context.has_input(3) ? ToInt64Vector(context.input(3)) : std::vector<int64_t>{};
      steps = context.has_input(4) ? ToInt64Vector(context.input(4)) : std::vector<int64_t>{};
    }
    ASSIGN_OR_RETURN(std::vector<SliceRange> ranges,
                     ResolveSlice(x.shape(), starts, ends, axes, steps));
    const int rank = x.rank();
    std::vector<int64_t> shape(rank);
    for (int i = 0; i < rank; ++i) shape[i] = ranges[i].count;
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    if (y->count() == 0) return absl::OkStatus();
    if (rank == 0) {
      std::memcpy(y->raw_data(), x.raw_data(), x.size());
      return absl::OkStatus();
    }
    std::vector<int64_t> in_strides(rank, 1);
    for (int i = rank - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * x.dim(i);
    int64_t base = 0;
    std::vector<int64_t> strides(rank);
    for (int i = 0; i < rank; ++i) {
      base += ranges[i].start * in_strides[i];
      strides[i] = ranges[i].step * in_strides[i];
    }
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      const int64_t inner = shape[rank - 1];
      const int64_t inner_stride = strides[rank - 1];
      std::vector<int64_t> index(rank, 0);
      int64_t offset = base;
      for (int64_t o = 0; o < y->count(); o += inner) {
        const T* src = in + offset;
        if (inner_stride == 1) {
          std::memcpy(out + o, src, sizeof(T) * inner);
        } else {
          for (int64_t i = 0; i < inner; ++i) out[o + i] = src[i * inner_stride];
        }
        for (int axis = rank - 1; axis-- > 0;) {
          ++index[axis];
          offset += strides[axis];
          if (index[axis] < shape[axis]) break;
          offset -= strides[axis] * shape[axis];
          index[axis] = 0;
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> starts_, ends_, axes_, steps_;
  bool from_inputs_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeSlice(NodeContext& context) {
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  std::vector<int64_t> starts, ends, axes, steps;
  bool all_constant = true;
  if (context.since_version() < 10) {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    ASSIGN_OR_RETURN(starts, context.Ints("starts"));
    ASSIGN_OR_RETURN(ends, context.Ints("ends"));
    ASSIGN_OR_RETURN(axes, context.Ints("axes", std::vector<int64_t>{}));
  } else {
    RETURN_IF_ERROR(context.ExpectInputs(3, 5));
    for (int i = 1; i <= 4; ++i) {
      RETURN_IF_ERROR(RequireType(context, i, IsIndexType));
      if (context.has_input(i) && context.constant_input(i) == nullptr) all_constant = false;
    }
    if (all_constant) {
      starts = ToInt64Vector(*context.constant_input(1));
      ends = ToInt64Vector(*context.constant_input(2));
      if (context.has_input(3)) axes = ToInt64Vector(*context.constant_input(3));
      if (context.has_input(4)) steps = ToInt64Vector(*context.constant_input(4));
    }
  }
  const ValueInfo& x = context.input(0);
  if (x.rank_known && all_constant) {
    ASSIGN_OR_RETURN(std::vector<SliceRange> ranges,
                     ResolveSlice(x.dims, starts, ends, axes, steps));
    std::vector<int64_t> dims;
    for (const SliceRange& range : ranges) dims.push_back(range.count);
    context.SetOutput(0, x.dtype, dims);
  } else if (x.rank_known) {
    // Bounds known only per run: the axes that are not sliced still keep their sizes, when the
    // sliced axes are known (constant, or by default the first as many as there are starts).
    std::vector<int64_t> dims(x.rank(), -1);
    std::optional<std::vector<int64_t>> sliced;
    if (context.has_input(3) && context.constant_input(3) != nullptr) {
      sliced = ToInt64Vector(*context.constant_input(3));
    } else if (!context.has_input(3) && context.input(1).rank() == 1 &&
               context.input(1).dims[0] >= 0) {
      sliced.emplace();
      for (int64_t i = 0; i < context.input(1).dims[0]; ++i) sliced->push_back(i);
    }
    if (sliced.has_value()) {
      std::vector<bool> is_sliced(x.rank(), false);
      bool valid = true;
      for (int64_t axis : *sliced) {
        const int64_t normalized = axis < 0 ? axis + x.rank() : axis;
        if (normalized < 0 || normalized >= x.rank()) {
          valid = false;  // the run reports it
          break;
        }
        is_sliced[normalized] = true;
      }
      for (int i = 0; valid && i < x.rank(); ++i) {
        if (!is_sliced[i]) dims[i] = x.dims[i];
      }
    }
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<SliceKernel>(std::move(starts), std::move(ends), std::move(axes),
                                 std::move(steps), !all_constant);
}

// ---------------------------------------------------------------------------------------------
// Gather and GatherElements.

class GatherKernel : public Kernel {
 public:
  explicit GatherKernel(int64_t axis) : axis_(axis) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& data = context.input(0);
    const Tensor& indices = context.input(1);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, data.rank()));
    std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + axis);
    shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
    shape.insert(shape.end(), data.shape().begin() + axis + 1, data.shape().end());
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, data.dtype(), shape));
    const std::vector<int64_t> index = ToInt64Vector(indices);
    const int64_t dim = data.dim(axis);
    const int64_t outer = Product(data.shape(), 0, axis);
    const int64_t inner = Product(data.shape(), axis + 1, data.rank());
    const size_t row = inner * ElementSize(data.dtype());
    const char* in = static_cast<const char*>(data.raw_data());
    char* out = static_cast<char*>(y->raw_data());
    const int64_t n = static_cast<int64_t>(index.size());
    for (int64_t i = 0; i < n; ++i) {
      if (index[i] < -dim || index[i] >= dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("index ", index[i], " is out of range for an axis of size ", dim));
      }
    }
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = index[i] < 0 ? index[i] + dim : index[i];
        std::memcpy(out + (o * n + i) * row, in + (o * dim + k) * row, row);
      }
    }
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeGather(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, IsIndexType));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", 0));
  const ValueInfo& data = context.input(0);
  const ValueInfo& indices = context.input(1);
  if (data.rank_known) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, data.rank()));
    if (const Tensor* constant = context.constant_input(1); constant && data.dims[a] >= 0) {
      for (int64_t k : ToInt64Vector(*constant)) {
        if (k < -data.dims[a] || k >= data.dims[a]) {
          return absl::InvalidArgumentError(
              absl::StrCat("index ", k, " is out of range for an axis of size ", data.dims[a]));
        }
      }
    }
    if (indices.rank_known) {
      std::vector<int64_t> dims(data.dims.begin(), data.dims.begin() + a);
      dims.insert(dims.end(), indices.dims.begin(), indices.dims.end());
      dims.insert(dims.end(), data.dims.begin() + a + 1, data.dims.end());
      context.SetOutput(0, data.dtype, dims);
      return MakeKernel<GatherKernel>(axis);
    }
  }
  context.SetOutputUnranked(0, data.dtype);
  return MakeKernel<GatherKernel>(axis);
}

class GatherElementsKernel : public Kernel {
 public:
  explicit GatherElementsKernel(int64_t axis) : axis_(axis) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& data = context.input(0);
    const Tensor& indices = context.input(1);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, data.rank()));
    if (indices.rank() != data.rank()) {
      return absl::InvalidArgumentError("indices must have the data's rank");
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, data.dtype(), indices.shape()));
    const std::vector<int64_t> index = ToInt64Vector(indices);
    const int rank = data.rank();
    std::vector<int64_t> data_strides(rank, 1);
    for (int i = rank - 1; i > 0; --i) data_strides[i - 1] = data_strides[i] * data.dim(i);
    const int64_t dim = data.dim(axis);
    absl::Status status;
    DispatchBySize(data.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(data.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      std::vector<int64_t> position(rank, 0);
      for (int64_t i = 0; i < y->count(); ++i) {
        int64_t k = index[i];
        if (k < -dim || k >= dim) {
          status = absl::InvalidArgumentError(absl::StrCat("index ", k, " is out of range"));
          return;
        }
        if (k < 0) k += dim;
        int64_t offset = 0;
        for (int d = 0; d < rank; ++d) {
          if (d != axis && position[d] >= data.dim(d)) {
            status = absl::InvalidArgumentError("indices shape exceeds the data");
            return;
          }
          offset += (d == axis ? k : position[d]) * data_strides[d];
        }
        out[i] = in[offset];
        for (int d = rank; d-- > 0;) {
          if (++position[d] < indices.dim(d)) break;
          position[d] = 0;
        }
      }
    });
    return status;
  }

 private:
  int64_t axis_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeGatherElements(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, IsIndexType));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", 0));
  ValueInfo out = context.input(1).ShapeOnly();
  out.dtype = context.input(0).dtype;
  context.SetOutput(0, out);
  return MakeKernel<GatherElementsKernel>(axis);
}

}  // namespace

void RegisterSliceKernels(KernelRegistry& registry) {
  registry.Register("Concat", {4, 11, 13}, MakeConcat);
  registry.Register("Split", {2, 11, 13, 18}, MakeSplit);
  registry.Register("Slice", {1, 10, 11, 13}, MakeSlice);
  registry.Register("Gather", {1, 11, 13}, MakeGather);
  registry.Register("GatherElements", {11, 13}, MakeGatherElements);
}

}  // namespace cloister::runtime
