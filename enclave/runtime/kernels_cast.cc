// Cast and CastLike CPU kernels, and the float16 conversions they (and kernel_util.h's users)
// use.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/onnx_tensor.h"

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
    TensorTypes::Dispatch(x.dtype(), [&](auto from_tag) {
      using From = decltype(from_tag);
      TensorTypes::Dispatch(to_, [&](auto to_tag) {
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

// Declares the output, input 0's shape in element type `to`, and makes the kernel.
absl::StatusOr<std::unique_ptr<Kernel>> CastTo(NodeContext& context, DataType to) {
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    context.SetOutput(0, to, x.dims);
  } else {
    context.SetOutputUnranked(0, to);
  }
  return MakeKernel<CastKernel>(to);
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeCast(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  if (context.since_version() < 6) {
    return absl::UnimplementedError("Cast-1 (string 'to' attribute) is not supported");
  }
  ASSIGN_OR_RETURN(int64_t to_code, context.Int("to"));
  absl::StatusOr<DataType> mapped = DataTypeFromOnnx(static_cast<int>(to_code));
  if (to_code != static_cast<int>(to_code) || !mapped.ok() || *mapped == DataType::kString) {
    return absl::UnimplementedError(
        absl::StrCat("cast to element type ", to_code, " is not supported"));
  }
  const DataType to = *mapped;
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  return CastTo(context, to);
}

// CastLike: Cast to the element type of input 1.
absl::StatusOr<std::unique_ptr<Kernel>> MakeCastLike(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, IsMovable));
  const DataType to = context.input(1).dtype;
  return CastTo(context, to);
}

}  // namespace

void RegisterCastKernels(KernelRegistry& registry) {
  registry.Register("Cast", {6, 9, 13}, MakeCast);
  registry.Register("CastLike", {15}, MakeCastLike);
}

}  // namespace cloister::runtime
