// Elementwise CPU kernels: unary math and activations, numpy-broadcast binary arithmetic,
// comparisons and logic, Where, variadic Max/Min/Sum/Mean, Clip and Cast.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/broadcast.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/simd.h"

namespace cloister::runtime {

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t result;
  if (exponent == 0) {
    if (mantissa == 0) {
      result = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      result = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    result = sign | 0x7f800000 | (mantissa << 13);
  } else {
    result = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &result, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;   // NaN
  if (magnitude >= 0x47800000) return sign | 0x7c00;  // overflow to infinity (>= 65536)
  if (magnitude < 0x38800000) {                       // subnormal or zero in half
    if (magnitude < 0x33000000) return sign;          // rounds to zero
    // value = mantissa * 2^(exponent - 150); in half subnormal units (2^-24) that is a right
    // shift by 126 - exponent, rounded to nearest even.
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  // Normal: rebias exponent, round mantissa to 10 bits (nearest even).
  uint32_t half = ((magnitude >> 13) - ((127 - 15) << 10));
  const uint32_t remainder = magnitude & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Unary kernels.

enum class TypeSet { kFloat, kSignedOrFloat, kNumeric, kBool };

bool InTypeSet(TypeSet set, DataType dtype) {
  switch (set) {
    case TypeSet::kFloat:
      return IsFloat(dtype);
    case TypeSet::kSignedOrFloat:
      return IsSignedOrFloat(dtype);
    case TypeSet::kNumeric:
      return IsNumeric(dtype);
    case TypeSet::kBool:
      return dtype == DataType::kBool;
  }
  return false;
}

template <TypeSet kSet, typename F>
bool DispatchSet(DataType dtype, F&& f) {
  if constexpr (kSet == TypeSet::kFloat) {
    return DispatchFloat(dtype, f);
  } else if constexpr (kSet == TypeSet::kSignedOrFloat) {
    switch (dtype) {
      case DataType::kInt8:
        f(int8_t{});
        return true;
      case DataType::kInt16:
        f(int16_t{});
        return true;
      case DataType::kInt32:
        f(int32_t{});
        return true;
      case DataType::kInt64:
        f(int64_t{});
        return true;
      default:
        return DispatchFloat(dtype, f);
    }
  } else if constexpr (kSet == TypeSet::kNumeric) {
    return DispatchNumeric(dtype, f);
  } else {
    if (dtype != DataType::kBool) return false;
    f(bool{});
    return true;
  }
}

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
    const bool ran = DispatchSet<Op::kTypes>(x.dtype(), [&](auto tag) {
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
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return InTypeSet(Op::kTypes, t); }));
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, std::move(info));
  return MakeKernel<UnaryKernel<Op>>(op);
}

struct ReluOp {
  static constexpr TypeSet kTypes = TypeSet::kSignedOrFloat;
  template <typename T>
  T operator()(T x) const {
    return x > T(0) ? x : T(0);
  }
};
struct NegOp {
  static constexpr TypeSet kTypes = TypeSet::kSignedOrFloat;
  template <typename T>
  T operator()(T x) const {
    return static_cast<T>(-x);
  }
};
struct AbsOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
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
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T x) const {
    if (std::isnan(static_cast<double>(x))) return x;
    return x > T(0) ? T(1) : (x < T(0) ? static_cast<T>(-1) : T(0));
  }
};
struct NotOp {
  static constexpr TypeSet kTypes = TypeSet::kBool;
  bool operator()(bool x) const { return !x; }
};

// Float-only math. The double overloads come from <cmath>.
#define CLOISTER_FLOAT_UNARY(Name, expression)         \
  struct Name {                                        \
    static constexpr TypeSet kTypes = TypeSet::kFloat; \
    template <typename T>                              \
    T operator()(T x) const {                          \
      return expression;                               \
    }                                                  \
  };
#define CLOISTER_VECTOR_UNARY(Name, expression, vector)       \
  struct Name {                                               \
    static constexpr TypeSet kTypes = TypeSet::kFloat;        \
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
  static constexpr TypeSet kTypes = TypeSet::kFloat;
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
    return 0.5f * x * (1.0f + simd::Erf(x * 0.70710678118654752f));
  }
};
struct HardSigmoidOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
  float alpha, beta;
  template <typename T>
  T operator()(T x) const {
    return std::max(T(0), std::min(T(1), T(alpha) * x + T(beta)));
  }
};
struct LeakyReluOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return x >= T(0) ? x : T(alpha) * x;
  }
};
struct EluOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return x >= T(0) ? x : T(alpha) * (std::exp(x) - T(1));
  }
};
struct CeluOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
  float alpha;
  template <typename T>
  T operator()(T x) const {
    return std::max(T(0), x) + std::min(T(0), T(alpha) * (std::exp(x / T(alpha)) - T(1)));
  }
};
struct SeluOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
  float alpha, gamma;
  template <typename T>
  T operator()(T x) const {
    return x > T(0) ? T(gamma) * x : T(gamma) * (T(alpha) * std::exp(x) - T(alpha));
  }
};
struct ThresholdedReluOp {
  static constexpr TypeSet kTypes = TypeSet::kFloat;
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

// ---------------------------------------------------------------------------------------------
// Binary kernels with broadcasting.

template <typename T, typename O, typename Op>
void RunBinary(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  O* po = static_cast<O*>(out.raw_data());
  if (a.shape() == b.shape()) {
    const int64_t count = out.count();
    for (int64_t i = 0; i < count; ++i) po[i] = op(pa[i], pb[i]);
    return;
  }
  auto layout = MakeBroadcastLayout<2>(out.shape(), {&a.shape(), &b.shape()});
  ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 2>& offsets,
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
  });
}

struct AddOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a + b);
  }
};
struct SubOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a - b);
  }
};
struct MulOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a * b);
  }
};
struct DivOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  static constexpr bool kChecksZero = true;
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a / b);
  }
};
struct MaxOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    }
    return a > b ? a : b;
  }
};
struct MinOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    }
    return a < b ? a : b;
  }
};
struct PReluOp {
  static constexpr TypeSet kTypes = TypeSet::kSignedOrFloat;
  template <typename T>
  T operator()(T x, T slope) const {
    return x < T(0) ? static_cast<T>(slope * x) : x;
  }
};
struct ModOp {  // integer mod with the sign of the divisor (Python semantics)
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
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
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
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
    DispatchSet<Op::kTypes>(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (ChecksZero<Op>::value && std::is_integral_v<T>) {
        if (HasZero<T>(b)) {
          status = absl::InvalidArgumentError("integer division by zero");
          return;
        }
      }
      RunBinary<T, T>(a, b, *out, Op{});
    });
    return status;
  }
};

template <typename Op>
KernelFactory Arithmetic() {
  return [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(2, 2));
    RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return InTypeSet(Op::kTypes, t); }));
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
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  bool operator()(T a, T b) const {
    return a == b;
  }
};
struct LessOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  bool operator()(T a, T b) const {
    return a < b;
  }
};
struct GreaterOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  bool operator()(T a, T b) const {
    return a > b;
  }
};
struct LessOrEqualOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  bool operator()(T a, T b) const {
    return a <= b;
  }
};
struct GreaterOrEqualOp {
  static constexpr TypeSet kTypes = TypeSet::kNumeric;
  template <typename T>
  bool operator()(T a, T b) const {
    return a >= b;
  }
};
struct AndOp {
  static constexpr TypeSet kTypes = TypeSet::kBool;
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp {
  static constexpr TypeSet kTypes = TypeSet::kBool;
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp {
  static constexpr TypeSet kTypes = TypeSet::kBool;
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
      RunBinary<T, bool>(a, b, *out, Op{});
    };
    if (kAllowBool && a.dtype() == DataType::kBool) {
      run(bool{});
    } else {
      DispatchSet<Op::kTypes>(a.dtype(), run);
    }
    return absl::OkStatus();
  }
};

template <typename Op, bool kAllowBool = false>
KernelFactory Compare() {
  return [](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(2, 2));
    RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) {
      return InTypeSet(Op::kTypes, t) || (kAllowBool && t == DataType::kBool);
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

template <typename F>
bool DispatchPowType(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat:
      f(float{});
      return true;
    case DataType::kDouble:
      f(double{});
      return true;
    case DataType::kInt32:
      f(int32_t{});
      return true;
    case DataType::kInt64:
      f(int64_t{});
      return true;
    default:
      return false;
  }
}

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
    DispatchPowType(a.dtype(), [&](auto base) {
      DispatchNumeric(b.dtype(), [&](auto exponent) {
        RunPow<decltype(base), decltype(exponent)>(a, b, *out);
      });
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakePow(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  auto accepted = [](DataType t) {
    return t == DataType::kFloat || t == DataType::kDouble || t == DataType::kInt32 ||
           t == DataType::kInt64;
  };
  RETURN_IF_ERROR(RequireType(context, 0, accepted));
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
      ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 3>& off,
                                      const std::array<int64_t, 3>& inner) {
        for (int64_t i = 0; i < n; ++i) {
          po[o + i] =
              pc[off[0] + i * inner[0]] ? px[off[1] + i * inner[1]] : py[off[2] + i * inner[2]];
        }
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
    DispatchNumeric(dtype, [&](auto tag) {
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
            RunBinary<T, T>(*out, context.input(i), *out, MaxOp{});
            break;
          case Variadic::kMin:
            RunBinary<T, T>(*out, context.input(i), *out, MinOp{});
            break;
          case Variadic::kSum:
          case Variadic::kMean:
            RunBinary<T, T>(*out, context.input(i), *out, AddOp{});
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

// Clip: bounds from attributes (before opset 11) or optional scalar inputs.
class ClipKernel : public Kernel {
 public:
  ClipKernel(double low, double high, bool bounds_from_inputs)
      : low_(low), high_(high), bounds_from_inputs_(bounds_from_inputs) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(Tensor * y, context.OutputReusingInput(0, 0, x.dtype(), x.shape()));
    absl::Status status;
    DispatchNumeric(x.dtype(), [&](auto tag) {
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

// Cast between any two supported types.
template <typename From, typename To>
To Convert(From value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // Out-of-range float to int conversion is undefined in C++: saturate, NaN gives 0.
    if (std::isnan(value)) return To(0);
    if (value <= static_cast<From>(std::numeric_limits<To>::lowest())) {
      return std::numeric_limits<To>::lowest();
    }
    if (value >= static_cast<From>(std::numeric_limits<To>::max())) {
      return std::numeric_limits<To>::max();
    }
    return static_cast<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

template <typename F>
bool DispatchCastType(DataType dtype, F&& f) {
  if (dtype == DataType::kFloat16) {
    f(Float16Bits{});
    return true;
  }
  return DispatchNumericOrBool(dtype, f);
}

class CastKernel : public Kernel {
 public:
  explicit CastKernel(DataType to) : to_(to) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.dtype() == to_) {
      context.SetOutput(0, x);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, to_, x.shape()));
    const int64_t count = x.count();
    DispatchCastType(x.dtype(), [&](auto from_tag) {
      using From = decltype(from_tag);
      DispatchCastType(to_, [&](auto to_tag) {
        using To = decltype(to_tag);
        const From* in = static_cast<const From*>(x.raw_data());
        To* out = static_cast<To*>(y->raw_data());
        for (int64_t i = 0; i < count; ++i) {
          if constexpr (std::is_same_v<From, Float16Bits> && std::is_same_v<To, Float16Bits>) {
            out[i] = in[i];
          } else if constexpr (std::is_same_v<From, Float16Bits>) {
            out[i] = Convert<float, To>(HalfToFloat(in[i].bits));
          } else if constexpr (std::is_same_v<To, Float16Bits>) {
            out[i] = Float16Bits{FloatToHalf(Convert<From, float>(in[i]))};
          } else {
            out[i] = Convert<From, To>(in[i]);
          }
        }
      });
    });
    return absl::OkStatus();
  }

 private:
  DataType to_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeCast(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  DataType to;
  if (context.since_version() < 6) {
    return absl::UnimplementedError("Cast-1 (string 'to' attribute) is not supported");
  }
  ASSIGN_OR_RETURN(int64_t to_code, context.Int("to"));
  auto mapped = [&]() -> absl::StatusOr<DataType> {
    switch (to_code) {
      case onnx::TensorProto::FLOAT:
        return DataType::kFloat;
      case onnx::TensorProto::DOUBLE:
        return DataType::kDouble;
      case onnx::TensorProto::FLOAT16:
        return DataType::kFloat16;
      case onnx::TensorProto::INT8:
        return DataType::kInt8;
      case onnx::TensorProto::INT16:
        return DataType::kInt16;
      case onnx::TensorProto::INT32:
        return DataType::kInt32;
      case onnx::TensorProto::INT64:
        return DataType::kInt64;
      case onnx::TensorProto::UINT8:
        return DataType::kUint8;
      case onnx::TensorProto::UINT16:
        return DataType::kUint16;
      case onnx::TensorProto::UINT32:
        return DataType::kUint32;
      case onnx::TensorProto::UINT64:
        return DataType::kUint64;
      case onnx::TensorProto::BOOL:
        return DataType::kBool;
      default:
        return absl::UnimplementedError(
            absl::StrCat("cast to element type ", to_code, " is not supported"));
    }
  }();
  if (!mapped.ok()) return mapped.status();
  to = *mapped;
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t != DataType::kString; }));
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    context.SetOutput(0, to, x.dims);
  } else {
    context.SetOutputUnranked(0, to);
  }
  return MakeKernel<CastKernel>(to);
}

// CastLike: Cast to the element type of input 1.
absl::StatusOr<std::unique_ptr<Kernel>> MakeCastLike(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t != DataType::kString; }));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t != DataType::kString; }));
  const DataType to = context.input(1).dtype;
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    context.SetOutput(0, to, x.dims);
  } else {
    context.SetOutputUnranked(0, to);
  }
  return MakeKernel<CastKernel>(to);
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
  registry.Register("Clip", {6, 11, 12, 13}, MakeClip);
  registry.Register("Cast", {6, 9, 13}, MakeCast);
  registry.Register("CastLike", {15}, MakeCastLike);
}

}  // namespace cloister::runtime
