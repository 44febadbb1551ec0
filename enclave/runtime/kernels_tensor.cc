// Tensor-manipulation CPU kernels: Constant, ConstantOfShape, Identity, Dropout (inference),
// Reshape, Flatten, Squeeze, Unsqueeze, Shape, Size, Transpose, Concat, Split, Slice, Gather,
// GatherElements, Expand, Tile, Pad, Range. Shape-only ops return views of their input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/broadcast.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/onnx_tensor.h"

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

// Largest tensor a run may produce (KernelContext::Output refuses more).
constexpr uint64_t kMaxTensorSize = uint64_t{1} << 32;

// Refuses at load a shape that is fully known from constants and larger than any run could
// produce, so a small model cannot declare a huge tensor. Unknown (-1) dimensions pass.
absl::Status CheckKnownShapeSize(DataType dtype, const std::vector<int64_t>& dims) {
  for (int64_t d : dims) {
    if (d < 0) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int64_t count, ElementCount(dims));
  if (static_cast<uint64_t>(count) > kMaxTensorSize / ElementSize(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("output of shape ", ShapeToString(dims), " is too large"));
  }
  return absl::OkStatus();
}

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
// Transpose.

template <typename T>
void TransposeCopy(const T* in, const std::vector<int64_t>& in_shape,
                   const std::vector<int64_t>& perm, T* out) {
  const size_t rank = perm.size();
  std::vector<int64_t> in_strides(rank, 1);
  for (size_t i = rank; i-- > 1;) in_strides[i - 1] = in_strides[i] * in_shape[i];
  std::vector<int64_t> out_shape(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    out_shape[i] = in_shape[perm[i]];
    strides[i] = in_strides[perm[i]];
  }
  int64_t total = 1;
  for (int64_t d : out_shape) total *= d;
  if (total == 0) return;
  if (rank == 0) {
    out[0] = in[0];
    return;
  }
  const int64_t inner = out_shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t o = 0; o < total; o += inner) {
    T* dst = out + o;
    const T* src = in + offset;
    if (inner_stride == 1) {
      std::memcpy(dst, src, sizeof(T) * inner);
    } else {
      for (int64_t i = 0; i < inner; ++i) dst[i] = src[i * inner_stride];
    }
    for (size_t axis = rank - 1; axis-- > 0;) {
      ++index[axis];
      offset += strides[axis];
      if (index[axis] < out_shape[axis]) break;
      offset -= strides[axis] * out_shape[axis];
      index[axis] = 0;
    }
  }
}

class TransposeKernel : public Kernel {
 public:
  explicit TransposeKernel(std::vector<int64_t> perm) : perm_(std::move(perm)) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> perm = perm_;
    if (perm.empty()) {
      for (int i = x.rank(); i-- > 0;) perm.push_back(i);
    }
    if (static_cast<int>(perm.size()) != x.rank()) {
      return absl::InvalidArgumentError("perm does not match the input rank");
    }
    std::vector<int64_t> shape(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) shape[i] = x.dim(static_cast<int>(perm[i]));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      TransposeCopy<T>(static_cast<const T*>(x.raw_data()), x.shape(), perm,
                       static_cast<T*>(y->raw_data()));
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> perm_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTranspose(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, context.Ints("perm", std::vector<int64_t>{}));
  const ValueInfo& x = context.input(0);
  if (!perm.empty()) {
    std::vector<bool> seen(perm.size(), false);
    for (int64_t p : perm) {
      if (p < 0 || p >= static_cast<int64_t>(perm.size()) || seen[p]) {
        return absl::InvalidArgumentError("perm is not a permutation");
      }
      seen[p] = true;
    }
  }
  if (x.rank_known) {
    if (!perm.empty() && static_cast<int>(perm.size()) != x.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("perm has ", perm.size(), " entries for rank ", x.rank()));
    }
    std::vector<int64_t> dims(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      dims[i] = x.dims[perm.empty() ? x.rank() - 1 - i : perm[i]];
    }
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<TransposeKernel>(std::move(perm));
}

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
  ValueInfo out = WithoutConstant(context.input(1));
  out.dtype = context.input(0).dtype;
  context.SetOutput(0, out);
  return MakeKernel<GatherElementsKernel>(axis);
}

// ---------------------------------------------------------------------------------------------
// Expand and Tile.

class ExpandKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                     BroadcastShapes(x.shape(), ToInt64Vector(context.input(1))));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    auto layout = MakeBroadcastLayout<1>(shape, {&x.shape()});
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 1>& off,
                                      const std::array<int64_t, 1>& inner) {
        if (inner[0] == 0) {
          std::fill(out + o, out + o + n, in[off[0]]);
        } else {
          std::memcpy(out + o, in + off[0], sizeof(T) * n);
        }
      });
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeExpand(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  const ValueInfo& x = context.input(0);
  const Tensor* shape = context.constant_input(1);
  if (x.rank_known && shape != nullptr) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(x.dims, ToInt64Vector(*shape)));
    RETURN_IF_ERROR(CheckKnownShapeSize(x.dtype, dims));
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<ExpandKernel>();
}

class TileKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> repeats = ToInt64Vector(context.input(1));
    if (static_cast<int>(repeats.size()) != x.rank()) {
      return absl::InvalidArgumentError("repeats must have one entry per input dimension");
    }
    std::vector<int64_t> shape(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      if (repeats[i] < 0) return absl::InvalidArgumentError("repeats must not be negative");
      if (repeats[i] != 0 && x.dim(i) > std::numeric_limits<int64_t>::max() / repeats[i]) {
        return absl::InvalidArgumentError("repeats overflow the output shape");
      }
      shape[i] = x.dim(i) * repeats[i];
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    const int rank = x.rank();
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      std::vector<int64_t> in_strides(rank, 1);
      for (int i = rank - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * x.dim(i);
      std::vector<int64_t> position(rank, 0);
      for (int64_t o = 0; o < y->count(); ++o) {
        int64_t offset = 0;
        for (int d = 0; d < rank; ++d) offset += (position[d] % x.dim(d)) * in_strides[d];
        out[o] = in[offset];
        for (int d = rank; d-- > 0;) {
          if (++position[d] < shape[d]) break;
          position[d] = 0;
        }
      }
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTile(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    std::vector<int64_t> dims(x.rank(), -1);
    if (const Tensor* repeats = context.constant_input(1)) {
      std::vector<int64_t> r = ToInt64Vector(*repeats);
      if (static_cast<int>(r.size()) != x.rank()) {
        return absl::InvalidArgumentError("repeats must have one entry per input dimension");
      }
      for (int i = 0; i < x.rank(); ++i) {
        if (r[i] < 0) return absl::InvalidArgumentError("repeats must not be negative");
        if (x.dims[i] < 0) continue;
        if (r[i] != 0 && x.dims[i] > std::numeric_limits<int64_t>::max() / r[i]) {
          return absl::InvalidArgumentError("repeats overflow the output shape");
        }
        dims[i] = x.dims[i] * r[i];
      }
      RETURN_IF_ERROR(CheckKnownShapeSize(x.dtype, dims));
    }
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<TileKernel>();
}

// ---------------------------------------------------------------------------------------------
// Pad.

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

class PadKernel : public Kernel {
 public:
  PadKernel(PadMode mode, std::vector<int64_t> pads, float value, bool from_inputs)
      : mode_(mode), pads_(std::move(pads)), value_(value), from_inputs_(from_inputs) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const int rank = x.rank();
    std::vector<int64_t> pads = pads_;
    if (from_inputs_) {
      std::vector<int64_t> given = ToInt64Vector(context.input(1));
      if (context.has_input(3)) {
        std::vector<int64_t> axes = ToInt64Vector(context.input(3));
        if (given.size() != 2 * axes.size()) {
          return absl::InvalidArgumentError("pads must have two entries per axis");
        }
        pads.assign(2 * rank, 0);
        for (size_t i = 0; i < axes.size(); ++i) {
          ASSIGN_OR_RETURN(int a, NormalizeAxis(axes[i], rank));
          pads[a] = given[i];
          pads[a + rank] = given[i + axes.size()];
        }
      } else {
        pads = std::move(given);
      }
    }
    if (static_cast<int>(pads.size()) != 2 * rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("pads has ", pads.size(), " entries for rank ", rank));
    }
    std::vector<int64_t> shape(rank);
    for (int i = 0; i < rank; ++i) {
      shape[i] = x.dim(i) + pads[i] + pads[i + rank];
      if (shape[i] < 0) return absl::InvalidArgumentError("pads remove more than the input");
      if (mode_ != PadMode::kConstant && x.dim(i) == 0 && shape[i] > 0) {
        return absl::InvalidArgumentError("cannot pad an empty axis except with a constant");
      }
      if (mode_ == PadMode::kReflect && (pads[i] >= x.dim(i) || pads[i + rank] >= x.dim(i)) &&
          (pads[i] > 0 || pads[i + rank] > 0)) {
        return absl::InvalidArgumentError("reflect pads must be smaller than the axis");
      }
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    if (y->count() == 0) return absl::OkStatus();
    absl::Status status;
    DispatchNumericOrBool(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T fill = static_cast<T>(value_);
      if (from_inputs_ && context.has_input(2)) {
        if (context.input(2).dtype() != x.dtype() || context.input(2).count() != 1) {
          status = absl::InvalidArgumentError("constant_value must be one value of the input type");
          return;
        }
        fill = *context.input(2).template data<T>();
      }
      const T* in = x.data<T>();
      T* out = y->data<T>();
      std::vector<int64_t> in_strides(rank, 1);
      for (int i = rank - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * x.dim(i);
      std::vector<int64_t> position(rank, 0);
      const int64_t inner = rank == 0 ? 1 : shape[rank - 1];
      for (int64_t o = 0; o < y->count(); o += inner) {
        // Source offset of the row, or -1 when the row lies in constant padding.
        int64_t offset = 0;
        bool outside = false;
        for (int d = 0; d + 1 < rank; ++d) {
          int64_t src = position[d] - pads[d];
          if (!MapIndex(src, x.dim(d))) outside = true;
          offset += src * in_strides[d];
        }
        T* dst = out + o;
        if (rank == 0) {
          dst[0] = in[0];
          break;
        }
        const int64_t last = x.dim(rank - 1);
        const int64_t before = pads[rank - 1];
        for (int64_t i = 0; i < inner; ++i) {
          int64_t src = i - before;
          if (outside || !MapIndex(src, last)) {
            dst[i] = fill;
          } else {
            dst[i] = in[offset + src];
          }
        }
        for (int d = rank - 1; d-- > 0;) {
          if (++position[d] < shape[d]) break;
          position[d] = 0;
        }
      }
    });
    return status;
  }

 private:
  // Maps a source index outside [0, size) according to the mode; false means constant fill.
  bool MapIndex(int64_t& index, int64_t size) const {
    if (index >= 0 && index < size) return true;
    switch (mode_) {
      case PadMode::kConstant:
        return false;
      case PadMode::kEdge:
        index = index < 0 ? 0 : size - 1;
        return true;
      case PadMode::kReflect:
        if (size == 1) {
          index = 0;
          return true;
        }
        while (index < 0 || index >= size) index = index < 0 ? -index : 2 * (size - 1) - index;
        return true;
      case PadMode::kWrap:
        index = ((index % size) + size) % size;
        return true;
    }
    return false;
  }

  PadMode mode_;
  std::vector<int64_t> pads_;
  float value_;
  bool from_inputs_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakePad(NodeContext& context) {
  const int version = context.since_version();
  RETURN_IF_ERROR(
      RequireType(context, 0, [](DataType t) { return IsNumeric(t) || t == DataType::kBool; }));
  ASSIGN_OR_RETURN(std::string mode_name, context.String("mode", "constant"));
  PadMode mode;
  if (mode_name == "constant") {
    mode = PadMode::kConstant;
  } else if (mode_name == "reflect") {
    mode = PadMode::kReflect;
  } else if (mode_name == "edge") {
    mode = PadMode::kEdge;
  } else if (mode_name == "wrap" && version >= 19) {
    mode = PadMode::kWrap;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("pad mode '", mode_name, "' is not supported"));
  }
  std::vector<int64_t> pads;
  float value = 0.0f;
  bool from_inputs = version >= 11;
  if (!from_inputs) {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    ASSIGN_OR_RETURN(pads, context.Ints(version < 2 ? "paddings" : "pads"));
    ASSIGN_OR_RETURN(value, context.Float("value", 0.0f));
  } else {
    RETURN_IF_ERROR(context.ExpectInputs(2, version >= 18 ? 4 : 3));
    RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
    RETURN_IF_ERROR(RequireSameType(context, 0, 2));
    RETURN_IF_ERROR(RequireType(context, 3, IsIndexType));
  }
  const ValueInfo& x = context.input(0);
  const Tensor* constant_pads = from_inputs ? context.constant_input(1) : nullptr;
  if (x.rank_known && (!from_inputs || (constant_pads && !context.has_input(3)))) {
    std::vector<int64_t> p = from_inputs ? ToInt64Vector(*constant_pads) : pads;
    if (static_cast<int>(p.size()) != 2 * x.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pads has ", p.size(), " entries for rank ", x.rank()));
    }
    std::vector<int64_t> dims(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      dims[i] = x.dims[i] < 0 ? -1 : x.dims[i] + p[i] + p[i + x.rank()];
    }
    context.SetOutput(0, x.dtype, dims);
  } else if (x.rank_known) {
    context.SetOutput(0, x.dtype, std::vector<int64_t>(x.rank(), -1));
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<PadKernel>(mode, std::move(pads), value, from_inputs);
}

// ---------------------------------------------------------------------------------------------
// Range.

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
    switch (dtype) {
      case DataType::kFloat:
        run(float{});
        break;
      case DataType::kDouble:
        run(double{});
        break;
      case DataType::kInt16:
        run(int16_t{});
        break;
      case DataType::kInt32:
        run(int32_t{});
        break;
      case DataType::kInt64:
        run(int64_t{});
        break;
      default:
        return absl::InternalError("Range dispatched on an unchecked type");
    }
    return status;
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeRange(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) {
    return t == DataType::kFloat || t == DataType::kDouble || t == DataType::kInt16 ||
           t == DataType::kInt32 || t == DataType::kInt64;
  }));
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
  registry.Register("Transpose", {1, 13}, MakeTranspose);
  registry.Register("Concat", {4, 11, 13}, MakeConcat);
  registry.Register("Split", {2, 11, 13, 18}, MakeSplit);
  registry.Register("Slice", {1, 10, 11, 13}, MakeSlice);
  registry.Register("Gather", {1, 11, 13}, MakeGather);
  registry.Register("GatherElements", {11, 13}, MakeGatherElements);
  registry.Register("Expand", {8, 13}, MakeExpand);
  registry.Register("Tile", {6, 13}, MakeTile);
  registry.Register("Pad", {2, 11, 13, 18}, MakePad);
  registry.Register("Range", {11}, MakeRange);
}

}  // namespace cloister::runtime
