// Tensor-manipulation CPU kernels that make or reinterpret tensors: Constant, ConstantOfShape,
// Identity, Dropout (inference), Reshape, Flatten, Squeeze, Unsqueeze, Shape, Size and Range.
// Shape-only ops return views of their input. Transpose, Expand, Tile and Pad are in
// kernels_layout.cc; Concat, Split, Slice, Gather and GatherElements in kernels_slice.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"

namespace cloister::runtime {
namespace {

ValueInfo WithoutConstant(const ValueInfo& info) { return info.ShapeOnly(); }

// A kernel whose single output is fixed at load time.
class ConstantKernel : public Kernel {
 public:
  explicit ConstantKernel(Tensor value) : value_(std::move(value)) {}
  absl::Status Compute(KernelContext& context) const override {
    context.SetOutput(0, value_);
    return absl::OkStatus();
  }

 private:
  Tensor value_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeConstant(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(0, 0));
  if (context.output_count() != 1) return absl::InvalidArgumentError("needs exactly one output");
  int set = 0;
  for (const auto& attribute : context.node().attribute()) {
    (void)attribute;
    ++set;
  }
  if (set != 1) {
    return absl::InvalidArgumentError("exactly one value attribute must be set");
  }
  absl::StatusOr<Tensor> value = absl::InvalidArgumentError("unsupported value attribute");
  if (context.has_attribute("value")) {
    value = context.TensorAttribute("value");
  } else if (context.has_attribute("value_float")) {
    ASSIGN_OR_RETURN(float v, context.Float("value_float"));
    value = Tensor::FromVector<float>({}, {v});
  } else if (context.has_attribute("value_floats")) {
    ASSIGN_OR_RETURN(std::vector<float> v, context.Floats("value_floats"));
    value = Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v);
  } else if (context.has_attribute("value_int")) {
    ASSIGN_OR_RETURN(int64_t v, context.Int("value_int"));
    value = Tensor::FromVector<int64_t>({}, {v});
  } else if (context.has_attribute("value_ints")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> v, context.Ints("value_ints"));
    value = Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "value attribute '", context.node().attribute(0).name(), "' is not supported"));
  }
  if (!value.ok()) return value.status();
  context.SetConstantOutput(0, *value);
  return MakeKernel<ConstantKernel>(*value);
}

class ConstantOfShapeKernel : public Kernel {
 public:
  explicit ConstantOfShapeKernel(Tensor value) : value_(std::move(value)) {}
  absl::Status Compute(KernelContext& context) const override {
    std::vector<int64_t> shape = ToInt64Vector(context.input(0));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, value_.dtype(), shape));
    DispatchBySize(value_.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T v = *static_cast<const T*>(value_.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      std::fill(out, out + y->count(), v);
    });
    return absl::OkStatus();
  }

 private:
  Tensor value_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeConstantOfShape(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t == DataType::kInt64; }));
  Tensor value;
  if (context.has_attribute("value")) {
    ASSIGN_OR_RETURN(value, context.TensorAttribute("value"));
    if (value.count() != 1) return absl::InvalidArgumentError("value must hold one element");
  } else {
    ASSIGN_OR_RETURN(value, Tensor::FromVector<float>({1}, {0.0f}));
  }
  const ValueInfo& shape = context.input(0);
  if (const Tensor* constant = context.constant_input(0)) {
    std::vector<int64_t> dims = ToInt64Vector(*constant);
    for (int64_t d : dims) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("shape ", ShapeToString(dims), " has a negative dimension"));
      }
    }
    RETURN_IF_ERROR(CheckKnownShapeSize(value.dtype(), dims));
    context.SetOutput(0, value.dtype(), std::move(dims));
  } else if (shape.rank_known && shape.rank() == 1 && shape.dims[0] >= 0) {
    context.SetOutput(0, value.dtype(), std::vector<int64_t>(shape.dims[0], -1));
  } else {
    context.SetOutputUnranked(0, value.dtype());
  }
  return MakeKernel<ConstantOfShapeKernel>(std::move(value));
}

// Identity and inference-mode Dropout: the output is the input (shared buffer).
class IdentityKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    context.SetOutput(0, context.input(0));
    for (size_t i = 1; i < context.outputs().size(); ++i) {
      ASSIGN_OR_RETURN(Tensor * mask, context.Output(static_cast<int>(i), DataType::kBool,
                                                     context.input(0).shape()));
      std::memset(mask->raw_data(), 1, mask->size());
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeIdentity(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  context.SetOutput(0, WithoutConstant(context.input(0)));
  return MakeKernel<IdentityKernel>();
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeDropout(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 3));
  RETURN_IF_ERROR(RequireType(context, 0, IsFloat));
  if (context.has_input(2)) {
    const Tensor* training = context.constant_input(2);
    if (training == nullptr || training->dtype() != DataType::kBool || *training->data<bool>()) {
      return absl::UnimplementedError("training mode is not supported");
    }
  }
  context.SetOutput(0, WithoutConstant(context.input(0)));
  if (context.output_count() > 1) {
    ValueInfo mask = WithoutConstant(context.input(0));
    mask.dtype = DataType::kBool;
    context.SetOutput(1, mask);
  }
  return MakeKernel<IdentityKernel>();
}

// ---------------------------------------------------------------------------------------------
// Reshape family: the output is a view of the input.

// Resolves a Reshape target against the input shape; input dims may be -1 at load time, in
// which case the affected output dims are -1 too.
absl::StatusOr<std::vector<int64_t>> ResolveReshape(const std::vector<int64_t>& input,
                                                    const std::vector<int64_t>& target,
                                                    bool allow_zero, bool input_known) {
  std::vector<int64_t> out(target.size());
  int infer = -1;
  int64_t known_product = 1;
  bool unknown = false;
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t d = target[i];
    if (d == -1) {
      if (infer >= 0) return absl::InvalidArgumentError("shape has more than one -1");
      infer = static_cast<int>(i);
      continue;
    }
    if (d < -1) return absl::InvalidArgumentError(absl::StrCat("invalid dimension ", d));
    if (d == 0 && !allow_zero) {
      if (i >= input.size()) {
        return absl::InvalidArgumentError("0 in shape refers past the input rank");
      }
      d = input[i];
    }
    out[i] = d;
    if (d < 0) {
      unknown = true;
    } else {
      known_product *= d;
    }
  }
  int64_t input_count = 1;
  bool input_unknown = !input_known;
  for (int64_t d : input) {
    if (d < 0) {
      input_unknown = true;
    } else {
      input_count *= d;
    }
  }
  if (infer >= 0) {
    if (input_unknown || unknown) {
      out[infer] = -1;
    } else if (known_product == 0 || input_count % known_product != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot reshape ", ShapeToString(input), " to ", ShapeToString(target)));
    } else {
      out[infer] = input_count / known_product;
    }
  } else if (!input_unknown && !unknown && known_product != input_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeToString(input), " to ", ShapeToString(target)));
  }
  return out;
}

class ReshapeKernel : public Kernel {
 public:
  ReshapeKernel(std::vector<int64_t> fixed_shape, bool from_input, bool allow_zero)
      : fixed_shape_(std::move(fixed_shape)), from_input_(from_input), allow_zero_(allow_zero) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> target = from_input_ ? ToInt64Vector(context.input(1)) : fixed_shape_;
    ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                     ResolveReshape(x.shape(), target, allow_zero_, true));
    context.SetOutput(0, x.Reshaped(std::move(shape)));
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> fixed_shape_;
  bool from_input_;
  bool allow_zero_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeReshape(NodeContext& context) {
  const bool from_input = context.since_version() >= 5;
  RETURN_IF_ERROR(context.ExpectInputs(from_input ? 2 : 1, from_input ? 2 : 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  bool allow_zero = false;
  if (context.since_version() >= 14) {
    ASSIGN_OR_RETURN(int64_t value, context.Int("allowzero", 0));
    allow_zero = value != 0;
  }
  std::vector<int64_t> fixed;
  const Tensor* target = nullptr;
  if (from_input) {
    RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
    target = context.constant_input(1);
    if (target) fixed = ToInt64Vector(*target);
  } else {
    ASSIGN_OR_RETURN(fixed, context.Ints("shape"));
  }
  const ValueInfo& x = context.input(0);
  if (!from_input || target != nullptr) {
    if (x.rank_known) {
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, ResolveReshape(x.dims, fixed, allow_zero, true));
      context.SetOutput(0, x.dtype, dims);
    } else {
      // Without the input rank, only dims that are plain positive numbers are known.
      std::vector<int64_t> dims = fixed;
      for (int64_t& d : dims) {
        if (d <= 0) d = -1;
      }
      context.SetOutput(0, x.dtype, dims);
    }
  } else {
    const ValueInfo& shape = context.input(1);
    if (shape.rank_known && shape.rank() == 1 && shape.dims[0] >= 0) {
      context.SetOutput(0, x.dtype, std::vector<int64_t>(shape.dims[0], -1));
    } else {
      context.SetOutputUnranked(0, x.dtype);
    }
  }
  return MakeKernel<ReshapeKernel>(std::move(fixed), from_input && target == nullptr, allow_zero);
}

class FlattenKernel : public Kernel {
 public:
  explicit FlattenKernel(int64_t axis) : axis_(axis) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    int64_t axis = axis_ < 0 ? axis_ + x.rank() : axis_;
    if (axis < 0 || axis > x.rank()) return absl::InvalidArgumentError("axis out of range");
    context.SetOutput(
        0, x.Reshaped({Product(x.shape(), 0, axis), Product(x.shape(), axis, x.rank())}));
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeFlatten(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", 1));
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    const int64_t a = axis < 0 ? axis + x.rank() : axis;
    if (a < 0 || a > x.rank()) return absl::InvalidArgumentError("axis out of range");
    auto product = [&](int begin, int end) -> int64_t {
      int64_t p = 1;
      for (int i = begin; i < end; ++i) {
        if (x.dims[i] < 0) return -1;
        p *= x.dims[i];
      }
      return p;
    };
    context.SetOutput(0, x.dtype,
                      {product(0, static_cast<int>(a)), product(static_cast<int>(a), x.rank())});
  } else {
    context.SetOutput(0, x.dtype, {-1, -1});
  }
  return MakeKernel<FlattenKernel>(axis);
}

absl::StatusOr<std::vector<int64_t>> SqueezeShape(const std::vector<int64_t>& input,
                                                  const std::vector<int64_t>& axes,
                                                  bool have_axes) {
  const int rank = static_cast<int>(input.size());
  std::vector<bool> drop(rank, false);
  if (have_axes) {
    for (int64_t axis : axes) {
      ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, rank));
      if (input[a] >= 0 && input[a] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot squeeze axis ", axis, " of shape ", ShapeToString(input)));
      }
      drop[a] = true;
    }
  } else {
    for (int i = 0; i < rank; ++i) {
      if (input[i] < 0) return absl::UnavailableError("unknown dims");
      drop[i] = input[i] == 1;
    }
  }
  std::vector<int64_t> out;
  for (int i = 0; i < rank; ++i) {
    if (!drop[i]) out.push_back(input[i]);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> UnsqueezeShape(const std::vector<int64_t>& input,
                                                    const std::vector<int64_t>& axes) {
  const int rank = static_cast<int>(input.size() + axes.size());
  std::vector<bool> inserted(rank, false);
  for (int64_t axis : axes) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, rank));
    if (inserted[a]) return absl::InvalidArgumentError("axes repeat");
    inserted[a] = true;
  }
  std::vector<int64_t> out;
  size_t next = 0;
  for (int i = 0; i < rank; ++i) out.push_back(inserted[i] ? 1 : input[next++]);
  return out;
}

class SqueezeKernel : public Kernel {
 public:
  SqueezeKernel(bool unsqueeze, std::vector<int64_t> axes, bool axes_from_input, bool have_axes)
      : unsqueeze_(unsqueeze),
        axes_(std::move(axes)),
        axes_from_input_(axes_from_input),
        have_axes_(have_axes) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> axes = axes_;
    bool have_axes = have_axes_;
    if (axes_from_input_ && context.has_input(1)) {
      axes = ToInt64Vector(context.input(1));
      have_axes = true;
    }
    std::vector<int64_t> shape;
    if (unsqueeze_) {
      ASSIGN_OR_RETURN(shape, UnsqueezeShape(x.shape(), axes));
    } else {
      ASSIGN_OR_RETURN(shape, SqueezeShape(x.shape(), axes, have_axes));
    }
    context.SetOutput(0, x.Reshaped(std::move(shape)));
    return absl::OkStatus();
  }

 private:
  bool unsqueeze_;
  std::vector<int64_t> axes_;
  bool axes_from_input_;
  bool have_axes_;
};

KernelFactory SqueezeFactory(bool unsqueeze) {
  return [unsqueeze](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    const bool from_input = context.since_version() >= 13;
    RETURN_IF_ERROR(context.ExpectInputs(from_input && unsqueeze ? 2 : 1, from_input ? 2 : 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
    std::vector<int64_t> axes;
    bool have_axes = false;
    bool axes_known = true;
    if (from_input) {
      RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
      if (context.has_input(1)) {
        have_axes = true;
        if (const Tensor* constant = context.constant_input(1)) {
          axes = ToInt64Vector(*constant);
        } else {
          axes_known = false;
        }
      }
    } else if (context.has_attribute("axes")) {
      ASSIGN_OR_RETURN(axes, context.Ints("axes"));
      have_axes = true;
    } else if (unsqueeze) {
      return absl::InvalidArgumentError("missing attribute 'axes'");
    }
    const ValueInfo& x = context.input(0);
    bool set = false;
    if (x.rank_known && axes_known) {
      absl::StatusOr<std::vector<int64_t>> dims =
          unsqueeze ? UnsqueezeShape(x.dims, axes) : SqueezeShape(x.dims, axes, have_axes);
      if (dims.ok()) {
        context.SetOutput(0, x.dtype, *dims);
        set = true;
      } else if (!absl::IsUnavailable(dims.status())) {
        return dims.status();
      }
    }
    if (!set) context.SetOutputUnranked(0, x.dtype);
    return MakeKernel<SqueezeKernel>(unsqueeze, std::move(axes), from_input && !axes_known,
                                     have_axes);
  };
}

// Shape and Size.
class ShapeKernel : public Kernel {
 public:
  ShapeKernel(int64_t start, std::optional<int64_t> end) : start_(start), end_(end) {}
  static std::pair<int64_t, int64_t> Range(int64_t start, std::optional<int64_t> end, int rank) {
    int64_t s = start < 0 ? start + rank : start;
    int64_t e = end.has_value() ? (*end < 0 ? *end + rank : *end) : rank;
    s = std::clamp<int64_t>(s, 0, rank);
    e = std::clamp<int64_t>(e, 0, rank);
    return {s, std::max(s, e)};
  }
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    auto [s, e] = Range(start_, end_, x.rank());
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kInt64, {e - s}));
    for (int64_t i = s; i < e; ++i) y->data<int64_t>()[i - s] = x.dim(static_cast<int>(i));
    return absl::OkStatus();
  }

 private:
  int64_t start_;
  std::optional<int64_t> end_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeShape(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  int64_t start = 0;
  std::optional<int64_t> end;
  if (context.since_version() >= 15) {
    ASSIGN_OR_RETURN(start, context.Int("start", 0));
    if (context.has_attribute("end")) {
      ASSIGN_OR_RETURN(end, context.Int("end"));
    }
  }
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    auto [s, e] = ShapeKernel::Range(start, end, x.rank());
    std::vector<int64_t> values(x.dims.begin() + s, x.dims.begin() + e);
    if (std::all_of(values.begin(), values.end(), [](int64_t d) { return d >= 0; })) {
      ASSIGN_OR_RETURN(Tensor constant,
                       Tensor::FromVector<int64_t>({static_cast<int64_t>(values.size())}, values));
      context.SetConstantOutput(0, std::move(constant));
    } else {
      context.SetOutput(0, DataType::kInt64, {e - s});
    }
  } else {
    context.SetOutput(0, DataType::kInt64, {-1});
  }
  return MakeKernel<ShapeKernel>(start, end);
}

class SizeKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kInt64, {}));
    *y->data<int64_t>() = context.input(0).count();
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeSize(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  const ValueInfo& x = context.input(0);
  if (x.fully_known()) {
    int64_t count = 1;
    for (int64_t d : x.dims) count *= d;
    ASSIGN_OR_RETURN(Tensor constant, Tensor::FromVector<int64_t>({}, {count}));
    context.SetConstantOutput(0, std::move(constant));
  } else {
    context.SetOutput(0, DataType::kInt64, {});
  }
  return MakeKernel<SizeKernel>();
}

// ---------------------------------------------------------------------------------------------
// Range.

using RangeTypes = ElementTypes<float, double, int16_t, int32_t, int64_t>;

class RangeKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const DataType dtype = context.input(0).dtype();
    absl::Status status;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      for (int i = 0; i < 3; ++i) {
        if (context.input(i).count() != 1) {
          status = absl::InvalidArgumentError("start, limit and delta must be scalars");
          return;
        }
      }
      const T start = *context.input(0).template data<T>();
      const T limit = *context.input(1).template data<T>();
      const T delta = *context.input(2).template data<T>();
      if (delta == T(0)) {
        status = absl::InvalidArgumentError("delta must not be 0");
        return;
      }
      const double steps = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) /
                                     static_cast<double>(delta));
      const int64_t count = std::max<int64_t>(0, static_cast<int64_t>(steps));
      auto y = context.Output(0, dtype, {count});
      if (!y.ok()) {
        status = y.status();
        return;
      }
      T* out = (*y)->template data<T>();
      for (int64_t i = 0; i < count; ++i)
        out[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    };
    if (!RangeTypes::Dispatch(dtype, run)) {
      return absl::InternalError("Range dispatched on an unchecked type");
    }
    return status;
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeRange(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, RangeTypes::Contains));
  RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  RETURN_IF_ERROR(RequireSameType(context, 0, 2));
  context.SetOutput(0, context.input(0).dtype, {-1});
  return MakeKernel<RangeKernel>();
}

}  // namespace

void RegisterTensorKernels(KernelRegistry& registry) {
  registry.Register("Constant", {1, 9, 11, 12, 13}, MakeConstant);
  registry.Register("ConstantOfShape", {9}, MakeConstantOfShape);
  registry.Register("Identity", {1, 13, 14, 16}, MakeIdentity);
  registry.Register("Dropout", {7, 10, 12, 13}, MakeDropout);
  registry.Register("Reshape", {1, 5, 13, 14}, MakeReshape);
  registry.Register("Flatten", {1, 9, 11, 13}, MakeFlatten);
  registry.Register("Squeeze", {1, 11, 13}, SqueezeFactory(false));
  registry.Register("Unsqueeze", {1, 11, 13}, SqueezeFactory(true));
  registry.Register("Shape", {1, 13, 15}, MakeShape);
  registry.Register("Size", {1, 13}, MakeSize);
  registry.Register("Range", {11}, MakeRange);
}

}  // namespace cloister::runtime
