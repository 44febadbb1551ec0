// Elementwise CPU kernels over several inputs: numpy-broadcast binary arithmetic (and the
// pre-opset-7 broadcasting rules), comparisons and logic, Pow, Where and variadic
// Max/Min/Sum/Mean. Unary kernels and Clip are in kernels_unary.cc, Cast in kernels_cast.cc.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/broadcast.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/parallel.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// Binary kernels with broadcasting.

// Writes out = op(a, b) with broadcasting; ranges of the output go to `workers` (null: this
// thread only). Each range reads and writes only its own elements, so `out` may be `a` or `b`.
template <typename T, typename O, typename Op>
void RunBinary(TaskPool* workers, const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  O* po = static_cast<O*>(out.raw_data());
  if (a.shape() == b.shape()) {
    ForRanges(workers, out.count(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = op(pa[i], pb[i]);
    });
    return;
  }
  auto layout = MakeBroadcastLayout<2>(out.shape(), {&a.shape(), &b.shape()});
  auto row = [&](int64_t o, int64_t n, const std::array<int64_t, 2>& offsets,
                 const std::array<int64_t, 2>& inner) {
    const T* ra = pa + offsets[0];
    const T* rb = pb + offsets[1];
    O* ro = po + o;
    if (inner[0] != 0 && inner[1] != 0) {
      for (int64_t i = 0; i < n; ++i) ro[i] = op(ra[i], rb[i]);
    } else if (inner[0] != 0) {
      const T vb = *rb;
      for (int64_t i = 0; i < n; ++i) ro[i] = op(ra[i], vb);
    } else if (inner[1] != 0) {
      const T va = *ra;
      for (int64_t i = 0; i < n; ++i) ro[i] = op(va, rb[i]);
    } else {
      const O value = op(*ra, *rb);
      for (int64_t i = 0; i < n; ++i) ro[i] = value;
    }
  };
  ForRanges(workers, BroadcastRows(layout), layout.dims.back(),
            [&](int64_t first, int64_t last) { ForEachBroadcastRowIn(layout, first, last, row); });
}

struct AddOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a + b);
  }
};
struct SubOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a - b);
  }
};
struct MulOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a * b);
  }
};
struct DivOp {
  using Types = NumericTypes;
  static constexpr bool kChecksZero = true;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a / b);
  }
};
struct MaxOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    }
    return a > b ? a : b;
  }
};
struct MinOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    }
    return a < b ? a : b;
  }
};
struct PReluOp {
  using Types = SignedOrFloatTypes;
  template <typename T>
  T operator()(T x, T slope) const {
    return x < T(0) ? static_cast<T>(slope * x) : x;
  }
};
struct ModOp {  // integer mod with the sign of the divisor (Python semantics)
  using Types = NumericTypes;
  static constexpr bool kChecksZero = true;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      T r = std::fmod(a, b);
      if (r != T(0) && ((r < T(0)) != (b < T(0)))) r += b;
      return r;
    } else if constexpr (std::is_unsigned_v<T>) {
      return static_cast<T>(a % b);
    } else {
      T r = static_cast<T>(a % b);
      if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
      return r;
    }
  }
};
struct FmodOp {  // C fmod: sign of the dividend
  using Types = NumericTypes;
  static constexpr bool kChecksZero = true;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return std::fmod(a, b);
    } else {
      return static_cast<T>(a % b);
    }
  }
};

template <typename Op, typename = void>
struct ChecksZero : std::false_type {};
template <typename Op>
struct ChecksZero<Op, std::void_t<decltype(Op::kChecksZero)>> : std::true_type {};

template <typename T>
bool HasZero(const Tensor& tensor) {
  const T* data = tensor.data<T>();
  for (int64_t i = 0; i < tensor.count(); ++i) {
    if (data[i] == T(0)) return true;
  }
  return false;
}

template <typename Op>
class ArithmeticKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, BroadcastShapes(a.shape(), b.shape()));
    Tensor* out;
    if (shape == a.shape()) {
      ASSIGN_OR_RETURN(out, context.OutputReusingInput(0, 0, a.dtype(), shape));
    } else if (shape == b.shape()) {
      ASSIGN_OR_RETURN(out, context.OutputReusingInput(0, 1, a.dtype(), shape));
    } else {
      ASSIGN_OR_RETURN(out, context.Output(0, a.dtype(), shape));
    }
    absl::Status status;
    Op::Types::Dispatch(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (ChecksZero<Op>::value && std::is_integral_v<T>) {
        if (HasZero<T>(b)) {
          status = absl::InvalidArgumentError("integer division by zero");
          return;
        }
      }
      RunBinary<T, T>(context.pool().workers(), a, b, *out, Op{});
    });
    return status;
  }
};

template <typename Op>
KernelFactory Arithmetic() {
  return [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(2, 2));
    RETURN_IF_ERROR(RequireType(context, 0, Op::Types::Contains));
    RETURN_IF_ERROR(RequireSameType(context, 0, 1));
    const ValueInfo& a = context.input(0);
    const ValueInfo& b = context.input(1);
    if (a.rank_known && b.rank_known) {
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(a.dims, b.dims));
      context.SetOutput(0, a.dtype, std::move(dims));
    } else {
      context.SetOutputUnranked(0, a.dtype);
    }
    return MakeKernel<ArithmeticKernel<Op>>();
  };
}

KernelFactory ModFactory() {
  return [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    ASSIGN_OR_RETURN(int64_t fmod, context.Int("fmod", 0));
    if (fmod == 0) {
      RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return !IsFloat(t); }));
      return Arithmetic<ModOp>()(context);
    }
    return Arithmetic<FmodOp>()(context);
  };
}

// Comparisons and logic produce bool.
struct EqualOp {
  using Types = NumericTypes;
  template <typename T>
  bool operator()(T a, T b) const {
    return a == b;
  }
};
struct LessOp {
  using Types = NumericTypes;
  template <typename T>
  bool operator()(T a, T b) const {
    return a < b;
  }
};
struct GreaterOp {
  using Types = NumericTypes;
  template <typename T>
  bool operator()(T a, T b) const {
    return a > b;
  }
};
struct LessOrEqualOp {
  using Types = NumericTypes;
  template <typename T>
  bool operator()(T a, T b) const {
    return a <= b;
  }
};
struct GreaterOrEqualOp {
  using Types = NumericTypes;
  template <typename T>
  bool operator()(T a, T b) const {
    return a >= b;
  }
};
struct AndOp {
  using Types = BoolTypes;
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp {
  using Types = BoolTypes;
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp {
  using Types = BoolTypes;
  bool operator()(bool a, bool b) const { return a != b; }
};

template <typename Op, bool kAllowBool>
class CompareKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, BroadcastShapes(a.shape(), b.shape()));
    ASSIGN_OR_RETURN(Tensor * out, context.Output(0, DataType::kBool, shape));
    auto run = [&](auto tag) {
      using T = decltype(tag);
      RunBinary<T, bool>(context.pool().workers(), a, b, *out, Op{});
    };
    if (kAllowBool && a.dtype() == DataType::kBool) {
      run(bool{});
    } else {
      Op::Types::Dispatch(a.dtype(), run);
    }
    return absl::OkStatus();
  }
};

template <typename Op, bool kAllowBool = false>
KernelFactory Compare() {
  return [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(2, 2));
    RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) {
      return Op::Types::Contains(t) || (kAllowBool && t == DataType::kBool);
    }));
    RETURN_IF_ERROR(RequireSameType(context, 0, 1));
    const ValueInfo& a = context.input(0);
    const ValueInfo& b = context.input(1);
    if (a.rank_known && b.rank_known) {
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(a.dims, b.dims));
      context.SetOutput(0, DataType::kBool, std::move(dims));
    } else {
      context.SetOutputUnranked(0, DataType::kBool);
    }
    return MakeKernel<CompareKernel<Op, kAllowBool>>();
  };
}

// Pow: base and exponent may have different types; the result has the base's type.
template <typename T, typename E>
void RunPow(const Tensor& a, const Tensor& b, Tensor& out) {
  if (b.count() == 1 && std::is_floating_point_v<T>) {
    const double exponent = static_cast<double>(*static_cast<const E*>(b.raw_data()));
    const T* in = a.data<T>();
    T* po = out.data<T>();
    const int64_t count = out.count();
    if (out.shape() == a.shape()) {
      if (exponent == 2.0) {
        for (int64_t i = 0; i < count; ++i) po[i] = in[i] * in[i];
        return;
      }
      if (exponent == 0.5) {
        for (int64_t i = 0; i < count; ++i) po[i] = std::sqrt(in[i]);
        return;
      }
      if (exponent == 1.0) {
        for (int64_t i = 0; i < count; ++i) po[i] = in[i];
        return;
      }
      if (exponent == 3.0) {
        for (int64_t i = 0; i < count; ++i) po[i] = in[i] * in[i] * in[i];
        return;
      }
    }
  }
  const T* pa = static_cast<const T*>(a.raw_data());
  const E* pb = static_cast<const E*>(b.raw_data());
  T* po = out.data<T>();
  auto layout = MakeBroadcastLayout<2>(out.shape(), {&a.shape(), &b.shape()});
  ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 2>& offsets,
                                  const std::array<int64_t, 2>& inner) {
    for (int64_t i = 0; i < n; ++i) {
      const T x = pa[offsets[0] + i * inner[0]];
      const E e = pb[offsets[1] + i * inner[1]];
      if constexpr (std::is_same_v<T, float>) {
        po[o + i] = std::pow(x, static_cast<float>(e));
      } else {
        po[o + i] = static_cast<T>(std::pow(static_cast<double>(x), static_cast<double>(e)));
      }
    }
  });
}

using PowBaseTypes = ElementTypes<float, double, int32_t, int64_t>;

class PowKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, BroadcastShapes(a.shape(), b.shape()));
    Tensor* out;
    if (shape == a.shape()) {
      ASSIGN_OR_RETURN(out, context.OutputReusingInput(0, 0, a.dtype(), shape));
    } else {
      ASSIGN_OR_RETURN(out, context.Output(0, a.dtype(), shape));
    }
    PowBaseTypes::Dispatch(a.dtype(), [&](auto base) {
      NumericTypes::Dispatch(b.dtype(), [&](auto exponent) {
        RunPow<decltype(base), decltype(exponent)>(a, b, *out);
      });
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakePow(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, PowBaseTypes::Contains));
  RETURN_IF_ERROR(RequireType(context, 1, IsNumeric));
  if (context.since_version() < 12) RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if (a.rank_known && b.rank_known) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(a.dims, b.dims));
    context.SetOutput(0, a.dtype, std::move(dims));
  } else {
    context.SetOutputUnranked(0, a.dtype);
  }
  return MakeKernel<PowKernel>();
}

// Where(condition, x, y).
class WhereKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& condition = context.input(0);
    const Tensor& x = context.input(1);
    const Tensor& y = context.input(2);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, BroadcastShapes(x.shape(), y.shape()));
    ASSIGN_OR_RETURN(shape, BroadcastShapes(condition.shape(), shape));
    ASSIGN_OR_RETURN(Tensor * out, context.Output(0, x.dtype(), shape));
    auto layout =
        MakeBroadcastLayout<3>(out->shape(), {&condition.shape(), &x.shape(), &y.shape()});
    const bool* pc = condition.data<bool>();
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(x.raw_data());
      const T* py = static_cast<const T*>(y.raw_data());
      T* po = static_cast<T*>(out->raw_data());
      // Each input's inner stride is 0 (broadcast) or 1; the usual cases get loops of their own.
      auto row = [&](int64_t o, int64_t n, const std::array<int64_t, 3>& off,
                     const std::array<int64_t, 3>& inner) {
        const bool* c = pc + off[0];
        const T* rx = px + off[1];
        const T* ry = py + off[2];
        T* ro = po + o;
        if (inner[0] == 1 && inner[1] == 1 && inner[2] == 1) {
          for (int64_t i = 0; i < n; ++i) ro[i] = c[i] ? rx[i] : ry[i];
        } else if (inner[0] == 0 && inner[1] == 0 && inner[2] == 1) {
          const T vx = *rx;
          if (*c) {
            std::fill(ro, ro + n, vx);
          } else {
            std::copy(ry, ry + n, ro);
          }
        } else if (inner[0] == 1 && inner[1] == 0 && inner[2] == 1) {
          const T vx = *rx;
          for (int64_t i = 0; i < n; ++i) ro[i] = c[i] ? vx : ry[i];
        } else if (inner[0] == 1 && inner[1] == 1 && inner[2] == 0) {
          const T vy = *ry;
          for (int64_t i = 0; i < n; ++i) ro[i] = c[i] ? rx[i] : vy;
        } else {
          for (int64_t i = 0; i < n; ++i) {
            ro[i] = c[i * inner[0]] ? rx[i * inner[1]] : ry[i * inner[2]];
          }
        }
      };
      ForRanges(context, BroadcastRows(layout), layout.dims.back(),
                [&](int64_t first, int64_t last) {
                  ForEachBroadcastRowIn(layout, first, last, row);
                });
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeWhere(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t == DataType::kBool; }));
  RETURN_IF_ERROR(RequireType(context, 1, IsMovable));
  RETURN_IF_ERROR(RequireSameType(context, 1, 2));
  const ValueInfo& c = context.input(0);
  const ValueInfo& x = context.input(1);
  const ValueInfo& y = context.input(2);
  if (c.rank_known && x.rank_known && y.rank_known) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(x.dims, y.dims));
    ASSIGN_OR_RETURN(dims, BroadcastShapes(c.dims, dims));
    context.SetOutput(0, x.dtype, std::move(dims));
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<WhereKernel>();
}

// Variadic Max, Min, Sum, Mean: folded pairwise into a full-size accumulator.
enum class Variadic { kMax, kMin, kSum, kMean };

class VariadicKernel : public Kernel {
 public:
  explicit VariadicKernel(Variadic kind) : kind_(kind) {}
  absl::Status Compute(KernelContext& context) const override {
    std::vector<int64_t> shape = context.input(0).shape();
    for (int i = 1; i < context.input_count(); ++i) {
      ASSIGN_OR_RETURN(shape, BroadcastShapes(shape, context.input(i).shape()));
    }
    const DataType dtype = context.input(0).dtype();
    ASSIGN_OR_RETURN(Tensor * out, context.Output(0, dtype, shape));
    NumericTypes::Dispatch(dtype, [&](auto tag) {
      using T = decltype(tag);
      // Start from input 0 broadcast to the output shape.
      const Tensor& first = context.input(0);
      const T* in = first.data<T>();
      T* po = out->data<T>();
      auto layout = MakeBroadcastLayout<1>(out->shape(), {&first.shape()});
      ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 1>& off,
                                      const std::array<int64_t, 1>& inner) {
        for (int64_t i = 0; i < n; ++i) po[o + i] = in[off[0] + i * inner[0]];
      });
      for (int i = 1; i < context.input_count(); ++i) {
        switch (kind_) {
          case Variadic::kMax:
            RunBinary<T, T>(nullptr, *out, context.input(i), *out, MaxOp{});
            break;
          case Variadic::kMin:
            RunBinary<T, T>(nullptr, *out, context.input(i), *out, MinOp{});
            break;
          case Variadic::kSum:
          case Variadic::kMean:
            RunBinary<T, T>(nullptr, *out, context.input(i), *out, AddOp{});
            break;
        }
      }
      if (kind_ == Variadic::kMean) {
        T* data = out->data<T>();
        const T n = static_cast<T>(context.input_count());
        for (int64_t i = 0; i < out->count(); ++i) data[i] = static_cast<T>(data[i] / n);
      }
    });
    return absl::OkStatus();
  }

 private:
  Variadic kind_;
};

KernelFactory VariadicFactory(Variadic kind) {
  return [kind](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    if (context.input_count() < 1) return absl::InvalidArgumentError("needs at least one input");
    bool ranks_known = true;
    std::vector<int64_t> dims;
    for (int i = 0; i < context.input_count(); ++i) {
      if (!context.has_input(i)) return absl::InvalidArgumentError("inputs cannot be absent");
      RETURN_IF_ERROR(RequireType(context, i, IsNumeric));
      RETURN_IF_ERROR(RequireSameType(context, 0, i));
      if (!context.input(i).rank_known) {
        ranks_known = false;
      } else if (ranks_known) {
        ASSIGN_OR_RETURN(dims, BroadcastShapes(dims, context.input(i).dims));
      }
    }
    if (ranks_known) {
      context.SetOutput(0, context.input(0).dtype, dims);
    } else {
      context.SetOutputUnranked(0, context.input(0).dtype);
    }
    return MakeKernel<VariadicKernel>(kind);
  };
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Binary operators before opset 7 (Add/Sub/Mul/Div-6, Pow-1, PRelu-6).
//
// They did not broadcast numpy-style. Inputs had equal shapes unless the node set `broadcast`
// to 1; then B's shape is a contiguous run of A's dimensions starting at `axis` (by default A's
// last dimensions), and B repeats over the others. PRelu-6 applies a one-dimensional slope per
// channel (axis 1). Giving B trailing ones up to A's rank turns either into numpy broadcasting,
// so the opset-7 kernel runs unchanged on a reshaped view of B.

class LegacyBroadcastKernel : public Kernel {
 public:
  LegacyBroadcastKernel(std::unique_ptr<Kernel> inner, int trailing_ones)
      : inner_(std::move(inner)), trailing_ones_(trailing_ones) {}
  absl::Status Compute(KernelContext& context) const override {
    std::vector<int64_t> shape = context.input(1).shape();
    shape.insert(shape.end(), trailing_ones_, 1);
    const Tensor b = context.input(1).Reshaped(std::move(shape));
    KernelContext inner_context({&context.input(0), &b}, {false, false}, 1, context.pool());
    RETURN_IF_ERROR(inner_->Compute(inner_context));
    context.SetOutput(0, std::move(inner_context.outputs()[0]));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Kernel> inner_;
  int trailing_ones_;
};

// How many trailing ones B needs for the legacy rule of `context`'s node, or an error when the
// shapes do not fit it.
absl::StatusOr<int> LegacyTrailingOnes(const NodeContext& context, bool per_channel_slope) {
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if (per_channel_slope) {
    if (!b.rank_known || b.rank() != 1 || b.dims[0] == 1 || !a.rank_known || a.rank() < 2) {
      return 0;
    }
    if (b.dims[0] >= 0 && a.dims[1] >= 0 && b.dims[0] != a.dims[1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slope of shape ", ShapeToString(b.dims), " for input of shape ", ShapeToString(a.dims)));
    }
    return a.rank() - 2;
  }
  ASSIGN_OR_RETURN(int64_t broadcast, context.Int("broadcast", 0));
  if (!a.rank_known || !b.rank_known) {
    if (broadcast != 0 && context.has_attribute("axis")) {
      return absl::UnimplementedError("broadcast along an axis needs input ranks known at load");
    }
    return 0;  // equal shapes, or B aligned with A's last dimensions: numpy agrees
  }
  if (broadcast == 0) {
    bool equal = a.rank() == b.rank();
    for (int i = 0; equal && i < a.rank(); ++i) {
      equal = a.dims[i] < 0 || b.dims[i] < 0 || a.dims[i] == b.dims[i];
    }
    if (!equal) {
      return absl::InvalidArgumentError(absl::StrCat("inputs of shapes ", ShapeToString(a.dims),
                                                     " and ", ShapeToString(b.dims),
                                                     " need broadcast=1 before opset 7"));
    }
    return 0;
  }
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", a.rank() - b.rank()));
  if (axis < 0) axis += a.rank();
  if (axis < 0 || axis + b.rank() > a.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("B of shape ", ShapeToString(b.dims),
                                                   " does not fit A of shape ",
                                                   ShapeToString(a.dims), " at axis ", axis));
  }
  for (int i = 0; i < b.rank(); ++i) {
    const int64_t bd = b.dims[i], ad = a.dims[axis + i];
    if (bd >= 0 && ad >= 0 && bd != ad && bd != 1) {
      return absl::InvalidArgumentError(absl::StrCat("B of shape ", ShapeToString(b.dims),
                                                     " does not match A of shape ",
                                                     ShapeToString(a.dims), " at axis ", axis));
    }
  }
  return static_cast<int>(a.rank() - axis - b.rank());
}

// Runs `inner` (the operator's opset-7 factory) on B's view with the trailing ones.
KernelFactory LegacyBinary(KernelFactory inner, bool per_channel_slope = false) {
  return
      [inner, per_channel_slope](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
        RETURN_IF_ERROR(context.ExpectInputs(2, 2));
        ASSIGN_OR_RETURN(int trailing_ones, LegacyTrailingOnes(context, per_channel_slope));
        ValueInfo b = context.input(1);
        if (trailing_ones > 0) {
          b.dims.insert(b.dims.end(), trailing_ones, 1);
          if (b.constant.has_value()) b.constant = b.constant->Reshaped(b.dims);
        }
        NodeContext inner_context(context.node(), 7, {context.input(0), std::move(b)}, 2, nullptr);
        ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, inner(inner_context));
        context.SetOutput(0, inner_context.outputs()[0]);
        if (trailing_ones == 0) return kernel;
        return MakeKernel<LegacyBroadcastKernel>(std::move(kernel), trailing_ones);
      };
}

// Max/Min/Sum/Mean before opset 8 took inputs of one shape only.
KernelFactory LegacySameShape(KernelFactory inner) {
  return [inner](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    for (int i = 1; i < context.input_count(); ++i) {
      const ValueInfo& first = context.input(0);
      const ValueInfo& other = context.input(i);
      if (!first.rank_known || !other.rank_known) continue;
      bool equal = first.rank() == other.rank();
      for (int d = 0; equal && d < first.rank(); ++d) {
        equal = first.dims[d] < 0 || other.dims[d] < 0 || first.dims[d] == other.dims[d];
      }
      if (!equal) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs of shapes ", ShapeToString(first.dims), " and ",
                         ShapeToString(other.dims), " differ; broadcasting needs opset 8"));
      }
    }
    return inner(context);
  };
}

void RegisterElementwiseKernels(KernelRegistry& registry) {
  // Binary arithmetic: version 7 introduced numpy broadcasting; 13/14 only widened the types.
  registry.Register("Add", {6}, LegacyBinary(Arithmetic<AddOp>()));
  registry.Register("Add", {7, 13, 14}, Arithmetic<AddOp>());
  registry.Register("Sub", {6}, LegacyBinary(Arithmetic<SubOp>()));
  registry.Register("Sub", {7, 13, 14}, Arithmetic<SubOp>());
  registry.Register("Mul", {6}, LegacyBinary(Arithmetic<MulOp>()));
  registry.Register("Mul", {7, 13, 14}, Arithmetic<MulOp>());
  registry.Register("Div", {6}, LegacyBinary(Arithmetic<DivOp>()));
  registry.Register("Div", {7, 13, 14}, Arithmetic<DivOp>());
  registry.Register("PRelu", {6}, LegacyBinary(Arithmetic<PReluOp>(), /*per_channel_slope=*/true));
  registry.Register("PRelu", {7, 9, 16}, Arithmetic<PReluOp>());
  registry.Register("Mod", {10, 13}, ModFactory());
  registry.Register("Pow", {1}, LegacyBinary(MakePow));
  registry.Register("Pow", {7, 12, 13, 15}, MakePow);
  registry.Register("Equal", {7, 11, 13}, Compare<EqualOp, true>());
  registry.Register("Less", {7, 9, 13}, Compare<LessOp>());
  registry.Register("Greater", {7, 9, 13}, Compare<GreaterOp>());
  registry.Register("LessOrEqual", {12, 16}, Compare<LessOrEqualOp>());
  registry.Register("GreaterOrEqual", {12, 16}, Compare<GreaterOrEqualOp>());
  registry.Register("And", {7}, Compare<AndOp>());
  registry.Register("Or", {7}, Compare<OrOp>());
  registry.Register("Xor", {7}, Compare<XorOp>());
  registry.Register("Where", {9, 16}, MakeWhere);
  registry.Register("Max", {6}, LegacySameShape(VariadicFactory(Variadic::kMax)));
  registry.Register("Max", {8, 12, 13}, VariadicFactory(Variadic::kMax));
  registry.Register("Min", {6}, LegacySameShape(VariadicFactory(Variadic::kMin)));
  registry.Register("Min", {8, 12, 13}, VariadicFactory(Variadic::kMin));
  registry.Register("Sum", {6}, LegacySameShape(VariadicFactory(Variadic::kSum)));
  registry.Register("Sum", {8, 13}, VariadicFactory(Variadic::kSum));
  registry.Register("Mean", {6}, LegacySameShape(VariadicFactory(Variadic::kMean)));
  registry.Register("Mean", {8, 13}, VariadicFactory(Variadic::kMean));
}

}  // namespace cloister::runtime
