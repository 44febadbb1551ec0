// Elementwise unary CPU kernels: math functions, activations (with their attributes) and Clip.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/simd.h"

namespace cloister::runtime {
namespace {

// Ops with a `simd::Vec Vector(simd::Vec)` member get the vectorised float path.
template <typename Op, typename = void>
struct HasVectorForm : std::false_type {};
template <typename Op>
struct HasVectorForm<Op, std::void_t<decltype(std::declval<const Op&>().Vector(simd::Vec{}))>>
    : std::true_type {};

template <typename Op>
class UnaryKernel : public Kernel {
 public:
  explicit UnaryKernel(Op op) : op_(op) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(Tensor * y, context.OutputReusingInput(0, 0, x.dtype(), x.shape()));
    if constexpr (HasVectorForm<Op>::value) {
      if (x.dtype() == DataType::kFloat) {
        simd::Map(x.data<float>(), y->data<float>(), x.count(),
                  [this](simd::Vec v) { return op_.Vector(v); });
        return absl::OkStatus();
      }
    }
    const bool ran = Op::Types::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      const int64_t count = x.count();
      for (int64_t i = 0; i < count; ++i) out[i] = op_(in[i]);
    });
    if (!ran) return absl::InternalError("unary kernel dispatched on an unchecked type");
    return absl::OkStatus();
  }

 private:
  Op op_;
};

template <typename Op>
absl::StatusOr<std::unique_ptr<Kernel>> MakeUnary(NodeContext& context, Op op) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, Op::Types::Contains));
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, std::move(info));
  return MakeKernel<UnaryKernel<Op>>(op);
}

struct ReluOp {
  using Types = SignedOrFloatTypes;
  template <typename T>
  T operator()(T x) const {
    return x > T(0) ? x : T(0);
  }
};
struct NegOp {
  using Types = SignedOrFloatTypes;
  template <typename T>
  T operator()(T x) const {
    return static_cast<T>(-x);
  }
};
struct AbsOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) {
      return x;
    } else {
      return x < T(0) ? static_cast<T>(-x) : x;
    }
  }
};
struct SignOp {
  using Types = NumericTypes;
  template <typename T>
  T operator()(T x) const {
    if (std::isnan(static_cast<double>(x))) return x;
    return x > T(0) ? T(1) : (x < T(0) ? static_cast<T>(-1) : T(0));
  }
};
struct NotOp {
  using Types = BoolTypes;
  bool operator()(bool x) const { return !x; }
};

// Float-only math. The double overloads come from <cmath>.
#define CLOISTER_FLOAT_UNARY(Name, expression) \
  struct Name {                                \
    using Types = FloatTypes;                  \
    template <typename T>                      \
    T operator()(T x) const {                  \
      return expression;                       \
    }                                          \
  };
#define CLOISTER_VECTOR_UNARY(Name, expression, vector)       \
  struct Name {                                               \
    using Types = FloatTypes;                                 \
    template <typename T>                                     \
    T operator()(T x) const {                                 \
      return expression;                                      \
    }                                                         \
    simd::Vec Vector(simd::Vec v) const { return vector(v); } \
  };
CLOISTER_VECTOR_UNARY(SigmoidOp,
                      x >= T(0) ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x)),
                      simd::Sigmoid)
CLOISTER_VECTOR_UNARY(TanhOp, std::tanh(x), simd::Tanh)
CLOISTER_VECTOR_UNARY(ErfOp, std::erf(x), simd::Erf)
CLOISTER_VECTOR_UNARY(ExpOp, std::exp(x), simd::Exp)
#undef CLOISTER_VECTOR_UNARY
CLOISTER_FLOAT_UNARY(SqrtOp, std::sqrt(x))
CLOISTER_FLOAT_UNARY(LogOp, std::log(x))
CLOISTER_FLOAT_UNARY(SinOp, std::sin(x))
CLOISTER_FLOAT_UNARY(CosOp, std::cos(x))
CLOISTER_FLOAT_UNARY(TanOp, std::tan(x))
CLOISTER_FLOAT_UNARY(AsinOp, std::asin(x))
CLOISTER_FLOAT_UNARY(AcosOp, std::acos(x))
CLOISTER_FLOAT_UNARY(AtanOp, std::atan(x))
CLOISTER_FLOAT_UNARY(SinhOp, std::sinh(x))
CLOISTER_FLOAT_UNARY(CoshOp, std::cosh(x))
CLOISTER_FLOAT_UNARY(AsinhOp, std::asinh(x))
CLOISTER_FLOAT_UNARY(AcoshOp, std::acosh(x))
CLOISTER_FLOAT_UNARY(AtanhOp, std::atanh(x))
CLOISTER_FLOAT_UNARY(FloorOp, std::floor(x))
CLOISTER_FLOAT_UNARY(CeilOp, std::ceil(x))
CLOISTER_FLOAT_UNARY(RoundOp, std::nearbyint(x))
CLOISTER_FLOAT_UNARY(ReciprocalOp, T(1) / x)
CLOISTER_FLOAT_UNARY(SoftsignOp, x / (T(1) + std::abs(x)))
CLOISTER_FLOAT_UNARY(SoftplusOp, x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)))
CLOISTER_FLOAT_UNARY(HardSwishOp, x* std::max(T(0), std::min(T(1), x / T(6) + T(0.5))))
#undef CLOISTER_FLOAT_UNARY

struct GeluOp {
  using Types = FloatTypes;
  bool tanh_approximation = false;
  template <typename T>
  T operator()(T x) const {
    if (tanh_approximation) {
      const T inner = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
      return T(0.5) * x * (T(1) + std::tanh(inner));
    }
    return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));
  }
  simd::Vec Vector(simd::Vec x) const {
    if (tanh_approximation) {
      return 0.5f * x * (1.0f + simd::Tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    return simd::Gelu(x);
  }
};
struct HardSigmoidOp {
  using Types = FloatTypes;
  float alpha, beta;
  template <typename T>
  T operator()(T x) const {
    return std::max(T(0), std::min(T(1), T(alpha) * x + T(beta)));
  }
};
struct LeakyReluOp {
  using Types = FloatTypes;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return x >= T(0) ? x : T(alpha) * x;
  }
};
struct EluOp {
  using Types = FloatTypes;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return x >= T(0) ? x : T(alpha) * (std::exp(x) - T(1));
  }
};
struct CeluOp {
  using Types = FloatTypes;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return std::max(T(0), x) + std::min(T(0), T(alpha) * (std::exp(x / T(alpha)) - T(1)));
  }
};
struct SeluOp {
  using Types = FloatTypes;
  float alpha, gamma;
  template <typename T>
  T operator()(T x) const {
    return x > T(0) ? T(gamma) * x : T(gamma) * (T(alpha) * std::exp(x) - T(alpha));
  }
};
struct ThresholdedReluOp {
  using Types = FloatTypes;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return x > T(alpha) ? x : T(0);
  }
};

template <typename Op>
KernelFactory Unary() {
  return [](NodeContext& context) { return MakeUnary(context, Op{}); };
}

// Clip: bounds from attributes (before opset 11) or optional scalar inputs.
class ClipKernel : public Kernel {
 public:
  ClipKernel(double low, double high, bool bounds_from_inputs)
      : low_(low), high_(high), bounds_from_inputs_(bounds_from_inputs) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(Tensor * y, context.OutputReusingInput(0, 0, x.dtype(), x.shape()));
    absl::Status status;
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T low = std::numeric_limits<T>::lowest();
      T high = std::numeric_limits<T>::max();
      if (bounds_from_inputs_) {
        for (int i = 1; i <= 2; ++i) {
          if (!context.has_input(i)) continue;
          if (context.input(i).count() != 1) {
            status = absl::InvalidArgumentError("min and max must be scalars");
            return;
          }
          (i == 1 ? low : high) = *context.input(i).template data<T>();
        }
      } else {
        low = static_cast<T>(low_);
        high = static_cast<T>(high_);
      }
      const T* in = x.data<T>();
      T* out = y->data<T>();
      for (int64_t i = 0; i < x.count(); ++i) {
        const T v = in[i] < low ? low : in[i];
        out[i] = v > high ? high : v;
      }
    });
    return status;
  }

 private:
  double low_, high_;
  bool bounds_from_inputs_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeClip(NodeContext& context) {
  double low = -std::numeric_limits<double>::infinity();
  double high = std::numeric_limits<double>::infinity();
  const bool from_inputs = context.since_version() >= 11;
  if (from_inputs) {
    RETURN_IF_ERROR(context.ExpectInputs(1, 3));
    RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
    RETURN_IF_ERROR(RequireSameType(context, 0, 1));
    RETURN_IF_ERROR(RequireSameType(context, 0, 2));
  } else {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsFloat));
    ASSIGN_OR_RETURN(float min_value, context.Float("min", -FLT_MAX));
    ASSIGN_OR_RETURN(float max_value, context.Float("max", FLT_MAX));
    low = min_value;
    high = max_value;
  }
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, std::move(info));
  return MakeKernel<ClipKernel>(low, high, from_inputs);
}

}  // namespace

void RegisterUnaryKernels(KernelRegistry& registry) {
  registry.Register("Relu", {6, 13, 14}, Unary<ReluOp>());
  registry.Register("Neg", {6, 13}, Unary<NegOp>());
  registry.Register("Abs", {6, 13}, Unary<AbsOp>());
  registry.Register("Sign", {9, 13}, Unary<SignOp>());
  registry.Register("Not", {1}, Unary<NotOp>());
  registry.Register("Sigmoid", {6, 13}, Unary<SigmoidOp>());
  registry.Register("Tanh", {6, 13}, Unary<TanhOp>());
  registry.Register("Erf", {9, 13}, Unary<ErfOp>());
  registry.Register("Sqrt", {6, 13}, Unary<SqrtOp>());
  registry.Register("Exp", {6, 13}, Unary<ExpOp>());
  registry.Register("Log", {6, 13}, Unary<LogOp>());
  registry.Register("Sin", {7}, Unary<SinOp>());
  registry.Register("Cos", {7}, Unary<CosOp>());
  registry.Register("Tan", {7}, Unary<TanOp>());
  registry.Register("Asin", {7}, Unary<AsinOp>());
  registry.Register("Acos", {7}, Unary<AcosOp>());
  registry.Register("Atan", {7}, Unary<AtanOp>());
  registry.Register("Sinh", {9}, Unary<SinhOp>());
  registry.Register("Cosh", {9}, Unary<CoshOp>());
  registry.Register("Asinh", {9}, Unary<AsinhOp>());
  registry.Register("Acosh", {9}, Unary<AcoshOp>());
  registry.Register("Atanh", {9}, Unary<AtanhOp>());
  registry.Register("Floor", {6, 13}, Unary<FloorOp>());
  registry.Register("Ceil", {6, 13}, Unary<CeilOp>());
  registry.Register("Round", {11}, Unary<RoundOp>());
  registry.Register("Reciprocal", {6, 13}, Unary<ReciprocalOp>());
  registry.Register("Softsign", {1}, Unary<SoftsignOp>());
  registry.Register("Softplus", {1}, Unary<SoftplusOp>());
  registry.Register("HardSwish", {14}, Unary<HardSwishOp>());
  registry.Register("HardSigmoid", {6},
                    [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
                      ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 0.2f));
                      ASSIGN_OR_RETURN(float beta, context.Float("beta", 0.5f));
                      return MakeUnary(context, HardSigmoidOp{alpha, beta});
                    });
  // Gelu is an opset-20 operator; at the opsets we accept it appears only as a fused node.
  registry.Register(
      "Gelu", {20}, [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
        absl::StatusOr<std::string> approximate = context.String("approximate", "none");
        if (!approximate.ok()) return approximate.status();
        const bool tanh = approximate->compare("tanh") == 0;
        if (!tanh && approximate->compare("none") != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("approximate '", *approximate, "' is not valid"));
        }
        return MakeUnary(context, GeluOp{tanh});
      });
  registry.Register("LeakyRelu", {6, 16},
                    [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
                      ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 0.01f));
                      return MakeUnary(context, LeakyReluOp{alpha});
                    });
  registry.Register("Elu", {6},
                    [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
                      ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.0f));
                      return MakeUnary(context, EluOp{alpha});
                    });
  registry.Register("Celu", {12},
                    [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
                      ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.0f));
                      return MakeUnary(context, CeluOp{alpha});
                    });
  registry.Register(
      "Selu", {6}, [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
        ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.67326319217681884765625f));
        ASSIGN_OR_RETURN(float gamma, context.Float("gamma", 1.05070102214813232421875f));
        return MakeUnary(context, SeluOp{alpha, gamma});
      });
  registry.Register("ThresholdedRelu", {10},
                    [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
                      ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.0f));
                      return MakeUnary(context, ThresholdedReluOp{alpha});
                    });
  registry.Register("Clip", {6, 11, 12, 13}, MakeClip);
}

}  // namespace cloister::runtime
